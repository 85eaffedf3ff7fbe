"""A supervisor started ahead of its sandbox: its interpreter starts and loads the supervisor
while the launcher prepares the run (the worktree, the mount plan, the proxy), on another
core, and then waits for its command line.

The launcher sends it over the Unix socket it was started with, once: the supervisor's
arguments (as `python -m gatekeeper.sandbox.supervise` takes them), as a length and JSON,
with the descriptors it is to hold (SCM_RIGHTS) and the number each must have (bubblewrap's
arguments name them: its status pipe, its seccomp filter, the plan's bind sources; 0, 1 and
2 are the sandbox's input and output). The process limit and the no-core limit are set on it
by the launcher before that. It then runs as a supervisor started for that sandbox would.

An end of the socket with nothing sent (the run failed before its sandbox, or the launcher
ended): it exits at once, having done nothing.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import struct
import sys
from typing import NoReturn

from gatekeeper.sandbox.supervise.__main__ import main

MAX_FDS = 250  # more than a plan holds (bubblewrap's bind sources, by descriptor)
LENGTH = struct.Struct("=Q")


def serve(control: int) -> NoReturn:
    sock = socket.socket(fileno=control)
    try:
        data, fds, _flags, _addr = socket.recv_fds(sock, 1 << 16, MAX_FDS)
        while data and len(data) < LENGTH.size + LENGTH.unpack_from(data)[0]:
            more = sock.recv(1 << 16)
            if not more:
                break
            data += more
    except (OSError, struct.error):
        os._exit(0)
    sock.close()
    if not data:
        os._exit(0)  # the launcher went on without it
    order = json.loads(data[LENGTH.size :])
    argv, targets = order["argv"], order["fds"]
    if len(fds) != len(targets) or len(data) != LENGTH.size + LENGTH.unpack_from(data)[0]:
        os.write(2, b"gatekeeper supervisor: an incomplete start order\n")
        os._exit(125)
    # Each descriptor goes to its number; first all above every number asked for, so that
    # none is put where another one still is.
    floor = max([*targets, 2]) + 1
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor) for fd in fds]
    for fd in fds:
        os.close(fd)
    for fd, target in zip(high, targets, strict=True):
        os.dup2(fd, target)  # inheritable, as Popen's pass_fds are: bubblewrap reads them
    for fd in high:
        os.close(fd)
    # As a supervisor started while the launcher stops the sandbox on these signals (its
    # handlers, which an exec resets) would have them: not ignored, whatever the launcher
    # was started with (nohup, a background job of a shell).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    code = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
