"""`ask` decisions: a prompt on the launcher's terminal with `--ask tty`, else pending."""

from __future__ import annotations

import fcntl
import os
import select
import threading
import time

from gatekeeper.sandbox.net.classify import Verdict
from gatekeeper.sandbox.net.record import Recorder
from gatekeeper.sandbox.supervise.display import escape

# One prompt at a time on the launcher's terminal, whoever asks.
PROMPT_LOCK = threading.Lock()
ASK_MODES = ("tty", "never")


def prompt_tty(
    question: str,
    tty_path: str = "/dev/tty",
    timeout: float = 300.0,
    cancel: threading.Event | None = None,
) -> bool | None:
    """Ask on the terminal: True for y/yes, False for anything else, None if no one can answer.

    Gives up (None) after timeout seconds or as soon as cancel is set; never raises.
    """
    try:
        fd = os.open(tty_path, os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return None
    try:
        deadline = time.monotonic() + timeout
        if not _lock_terminal(fd, deadline, cancel):
            return None
        os.write(fd, question.encode("utf-8", "replace"))
        answer = b""
        while not answer.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (cancel is not None and cancel.is_set()):
                os.write(fd, b"\n(no answer; denied)\n")
                return None
            if not select.select([fd], [], [], min(remaining, 0.2))[0]:
                continue
            chunk = os.read(fd, 256)
            if not chunk:
                return None
            answer += chunk
        return answer.strip().lower() in (b"y", b"yes")
    except OSError:
        return None
    finally:
        os.close(fd)


def _lock_terminal(fd: int, deadline: float, cancel: threading.Event | None) -> bool:
    """Take an exclusive flock on the terminal, so prompts from other processes (the
    supervisor's command prompts) never interleave with ours; False if it never came free."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline or (cancel is not None and cancel.is_set()):
                return False
            time.sleep(0.05)
        except OSError:
            return True  # a terminal that cannot be locked: ask anyway


class Asker:
    """Turns an `ask` verdict into yes or no, once per destination and category for the run."""

    def __init__(
        self, mode: str, recorder: Recorder, *, tty_path: str = "/dev/tty", timeout: float = 300.0
    ) -> None:
        if mode not in ASK_MODES:
            raise ValueError(f"--ask {mode!r}: expected one of {', '.join(ASK_MODES)}")
        self.mode = mode
        self.recorder = recorder
        self.tty_path = tty_path
        self.timeout = timeout
        self._answers: dict[tuple[str, str], bool] = {}
        self.cancel = threading.Event()

    def close(self) -> None:
        """Abandon any prompt still waiting for an answer (the run is over)."""
        self.cancel.set()

    def ask(self, host: str, verdict: Verdict) -> bool:
        """Blocking (run it off the event loop); records the escalation and its outcome."""
        key = (verdict.grant_hint, verdict.category.value)
        with PROMPT_LOCK:
            if key in self._answers:
                return self._answers[key]
            if self.cancel.is_set():
                return False
            answer: bool | None = None
            if self.mode == "tty":
                # Names are validated before they get here; escape anyway: nothing the agent
                # chose reaches the terminal raw.
                question = (
                    f"\ngatekeeper: the agent wants to reach {escape(verdict.grant_hint)} "
                    f"({verdict.category.value}: {escape(verdict.reason)}).\n"
                    f"Allow it for the rest of this run? [y/N] "
                )
                answer = prompt_tty(question, self.tty_path, self.timeout, self.cancel)
            if answer is None:
                self.recorder.escalate(verdict.grant_hint, "pending")
            else:
                self.recorder.escalate(verdict.grant_hint, "granted" if answer else "denied")
            self._answers[key] = bool(answer)
            return bool(answer)
