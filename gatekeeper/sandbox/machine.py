"""Can this machine build the sandbox? Each need checked on its own, with the fix when it fails.

The sandbox needs bubblewrap (0.8 or newer, for --disable-userns), user namespaces that the
launcher's user may create, and seccomp user notification (Linux 5.5 or newer). A pids cgroup
is optional: without one the process limit falls back to RLIMIT_NPROC. `gatekeeper selftest`
prints these before it runs anything, and `run` names the failing one when bubblewrap cannot
set the sandbox up.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from gatekeeper.errors import SandboxError
from gatekeeper.sandbox.limits import ADDR_NO_RANDOMIZE, ProcessLimit
from gatekeeper.sandbox.mounts import bwrap_path, bwrap_version, namespace_args

MIN_BWRAP = (0, 8, 0)  # --disable-userns
MIN_KERNEL = (5, 5)  # SECCOMP_USER_NOTIF_FLAG_CONTINUE

USERNS_CLONE = Path("/proc/sys/kernel/unprivileged_userns_clone")
MAX_USERNS = Path("/proc/sys/user/max_user_namespaces")
APPARMOR_USERNS = Path("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
SECCOMP_ACTIONS = Path("/proc/sys/kernel/seccomp/actions_avail")
RANDOMIZE_VA_SPACE = Path("/proc/sys/kernel/randomize_va_space")

APPARMOR_PROFILE = (
    "abi <abi/4.0>,\\ninclude <tunables/global>\\n"
    "profile bwrap {bwrap} flags=(unconfined) {{\\n  userns,\\n}}\\n"
)


@dataclass(frozen=True)
class MachineCheck:
    """One need of the sandbox: met or not, what was found, and how to fix it."""

    name: str
    ok: bool
    detail: str
    fix: str | None = None
    required: bool = True  # False: runs work without it (they say what is missing)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def check_bubblewrap() -> MachineCheck:
    """bwrap on PATH, new enough for the options the sandbox passes."""
    try:
        path = bwrap_path()
    except SandboxError as exc:
        path_var = os.environ.get("PATH", "")
        return MachineCheck("bubblewrap", False, f"{exc.message} (PATH={path_var})",
                            fix=exc.hint)  # fmt: skip
    version = bwrap_version(path)
    if version != "unknown" and _version(version) < MIN_BWRAP:
        return MachineCheck(
            "bubblewrap", False, f"bubblewrap {version} at {path} is too old (0.8.0 or newer "
            "is needed, for --disable-userns)",
            fix="install a newer bubblewrap: Debian 12, Ubuntu 24.04, Fedora 38 and newer "
            "ship one; or build it from its release tarball",
        )  # fmt: skip
    return MachineCheck("bubblewrap", True, f"bubblewrap {version} at {path}")


def userns_restriction() -> MachineCheck | None:
    """What the kernel's settings say about user namespaces: a failing check naming the setting
    and the fix, or None when nothing forbids them."""
    if _read(MAX_USERNS) == "0":
        return MachineCheck(
            "user namespaces", False, "user namespaces are disabled (user.max_user_namespaces=0)",
            fix="`sudo sysctl -w user.max_user_namespaces=15000` (and the same line in "
            "/etc/sysctl.d/99-userns.conf to keep it)",
        )  # fmt: skip
    if os.geteuid() == 0:
        return None  # root may create them whatever the two settings below say
    if _read(USERNS_CLONE) == "0":
        return MachineCheck(
            "user namespaces", False,
            "unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone=0)",
            fix="`sudo sysctl -w kernel.unprivileged_userns_clone=1` (and "
            "`kernel.unprivileged_userns_clone=1` in /etc/sysctl.d/99-userns.conf to keep it), "
            "or run gatekeeper as root",
        )  # fmt: skip
    if _read(APPARMOR_USERNS) == "1":
        return MachineCheck(
            "user namespaces",
            False,
            "AppArmor restricts unprivileged user namespaces "
            "(kernel.apparmor_restrict_unprivileged_userns=1, Ubuntu 23.10 and newer)",
            fix=apparmor_fix(),
        )
    return None


def apparmor_fix() -> str:
    """How to let bubblewrap make user namespaces under Ubuntu's AppArmor restriction."""
    bwrap = shutil.which("bwrap") or "/usr/bin/bwrap"
    profile = APPARMOR_PROFILE.format(bwrap=bwrap)
    return (
        f"allow bubblewrap alone: `printf '{profile}' | sudo tee /etc/apparmor.d/bwrap && "
        "sudo apparmor_parser -r /etc/apparmor.d/bwrap`; or lift the restriction for every "
        "program: `sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`"
    )


def check_user_namespaces(bwrap: str) -> MachineCheck:
    """Start the smallest sandbox with the namespaces every run uses (about 10 ms)."""
    restriction = userns_restriction()
    argv = [bwrap, *namespace_args(), "--ro-bind", "/", "/", "--proc", "/proc",
            "--remount-ro", "/proc", "--dev", "/dev",
            "--", "true"]  # fmt: skip
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return MachineCheck("user namespaces", False, f"bubblewrap could not start: {exc}",
                            fix="reinstall bubblewrap")  # fmt: skip
    if proc.returncode == 0:
        return MachineCheck(
            "user namespaces", True,
            "bubblewrap made user, pid, network, ipc and mount namespaces",
        )  # fmt: skip
    said = " ".join(proc.stderr.split())[:300] or f"exit {proc.returncode}"
    if restriction is not None:
        return MachineCheck(restriction.name, False, f"{restriction.detail}; bubblewrap said: "
                            f"{said}", fix=restriction.fix)  # fmt: skip
    return MachineCheck(
        "user namespaces", False, f"bubblewrap could not build the namespaces: {said}",
        fix="if it names a uid map or namespace: enable unprivileged user namespaces "
        "(`sudo sysctl -w kernel.unprivileged_userns_clone=1`, or on Ubuntu 23.10 and newer "
        "allow bubblewrap in AppArmor: see kernel.apparmor_restrict_unprivileged_userns); "
        "inside a container, run it with user namespaces allowed (e.g. a seccomp profile "
        "that permits clone/unshare of user namespaces)",
    )  # fmt: skip


def _probe_listener() -> str | None:
    """Install a seccomp filter with a notification listener in a child; None when it works,
    else the kernel's answer."""
    from gatekeeper.sandbox.supervise import unotify

    allow = [(0x06, 0, 0, unotify.SECCOMP_RET_ALLOW)]  # BPF_RET|BPF_K: allow every call
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child only reports)
        code = 0
        try:
            os.close(read_fd)
            os.close(unotify.install_listener(allow))
        except OSError as exc:
            os.write(write_fd, str(exc).encode()[:500])
            code = 1
        os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as fh:
        said = fh.read().decode("utf-8", "replace")
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return None
    return said or f"the test process ended with status {status}"


def check_seccomp_notify() -> MachineCheck:
    """Seccomp user notification (the supervisor's eyes): kernel 5.5+, and the kernel agrees."""
    release = platform.release()
    fix = "use Linux 5.5 or newer (Debian 11, Ubuntu 20.04 HWE, RHEL 9 and newer have it)"
    if _version(release)[:2] < MIN_KERNEL:
        return MachineCheck(
            "seccomp user notification", False,
            f"Linux {release} has no seccomp user notification with continue (5.5 or newer)",
            fix=fix,
        )  # fmt: skip
    actions = _read(SECCOMP_ACTIONS)
    if actions is not None and "user_notif" not in actions.split():
        return MachineCheck("seccomp user notification", False,
                            f"the kernel offers seccomp actions {actions!r}, not user_notif",
                            fix=fix)  # fmt: skip
    failed = _probe_listener()
    if failed is not None:
        return MachineCheck(
            "seccomp user notification", False,
            f"the kernel refused a notifying seccomp filter: {failed}",
            fix=f"{fix}; inside a container, allow the seccomp syscall (a container runtime's "
            "default profile may refuse it)",
        )  # fmt: skip
    return MachineCheck("seccomp user notification", True, f"Linux {release}")


def check_cgroups() -> MachineCheck:
    """A pids cgroup for each run: optional; without it the process cap is RLIMIT_NPROC."""
    limit = ProcessLimit(f"selftest-{os.getpid()}", 64)
    try:
        mechanism, where = limit.mechanism, limit.path
    finally:
        limit.remove()
    if mechanism == "cgroup":
        return MachineCheck("cgroup delegation", True,
                            f"runs get a pids cgroup under {where.parent if where else '?'}",
                            required=False)  # fmt: skip
    fix = ("give your user a delegated cgroup v2 subtree with the pids controller enabled "
           "(systemd: run gatekeeper in a unit or scope with Delegate=yes, and enable +pids "
           "in its cgroup.subtree_control)")  # fmt: skip
    if mechanism == "rlimit":
        detail = ("no pids cgroup can be made here: each run caps its processes with "
                  "RLIMIT_NPROC (counted across all your processes) instead; the pid namespace "
                  "still ends every process of a run with it")  # fmt: skip
    else:
        detail = ("no pids cgroup can be made here, and RLIMIT_NPROC does not bind root: "
                  "limits.max_processes is not enforced; the pid namespace still ends every "
                  "process of a run with it")  # fmt: skip
    return MachineCheck("cgroup delegation", False, detail, fix=fix, required=False)


def stacks_differ(runs: int = 2) -> bool | None:
    """Whether programs this process starts have their stacks at different addresses, seen
    in the maps of `cat /proc/self/maps` run twice: address randomization, as the sandbox
    has it; None when that cannot be seen (no cat, no stack line, or this process started
    under `setarch -R`, which its programs inherit and a run turns off for the sandbox)."""
    personality = _read(Path("/proc/self/personality"))
    cat = shutil.which("cat", path="/usr/bin:/bin")
    if cat is None or personality is None or int(personality, 16) & ADDR_NO_RANDOMIZE:
        return None
    stacks = set()
    for _ in range(runs):
        try:
            maps = subprocess.run([cat, "/proc/self/maps"], capture_output=True, timeout=10,
                                  check=True).stdout  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            return None
        stack = [line.split()[0] for line in maps.splitlines() if line.endswith(b"[stack]")]
        if len(stack) != 1:
            return None
        stacks.add(stack[0])
    return len(stacks) > 1


def check_address_randomization() -> MachineCheck:
    """Address space layout randomization: optional (runs work without it), but the
    supervisor's evidence that a thread's exec replaced the process rests on it. Where the
    setting cannot be read (a container may hide /proc/sys), it is seen (stacks_differ)."""
    value = _read(RANDOMIZE_VA_SPACE)
    if value is None:
        seen = stacks_differ()
        if seen:
            return MachineCheck("address randomization", True,
                                "on (kernel.randomize_va_space cannot be read here; two "
                                "programs started had their stacks at different addresses)",
                                required=False)  # fmt: skip
        if seen is False:
            return MachineCheck(
                "address randomization",
                False,
                "off: kernel.randomize_va_space cannot be read here, and two programs started "
                "had their stacks at the same address; a program that re-runs its own file "
                "from a thread other than its first, laid out as before, can keep the calls of "
                "the processes it starts unchecked for a while (the mount layer still refuses "
                "every write outside the write set)",
                fix="turn address randomization on where this runs (on the host of a "
                "container: sysctl -w kernel.randomize_va_space=2), and make "
                f"{RANDOMIZE_VA_SPACE} readable here",
                required=False,
            )
        if seen is None:
            return MachineCheck(
                "address randomization",
                False,
                f"unknown: {RANDOMIZE_VA_SPACE} cannot be read here, and it could not be "
                "seen whether the programs a run starts are laid out at random addresses",
                fix=f"make {RANDOMIZE_VA_SPACE} readable to this user, and check that it is not 0",
                required=False,
            )
    elif value != "0":
        return MachineCheck("address randomization", True,
                            f"kernel.randomize_va_space = {value}",
                            required=False)  # fmt: skip
    return MachineCheck(
        "address randomization",
        False,
        "off for every process (kernel.randomize_va_space = 0): a program that re-runs its own "
        "file from a thread other than its first, laid out as before, can keep the calls of "
        "the processes it starts unchecked for a while (the mount layer still refuses every "
        "write outside the write set)",
        fix="sysctl -w kernel.randomize_va_space=2 (and drop the setting that turned it off "
        "from /etc/sysctl.conf or /etc/sysctl.d)",
        required=False,
    )


def randomization_warning() -> str | None:
    """A line for a run's error output when address randomization is off, else None."""
    check = check_address_randomization()
    return None if check.ok else f"address randomization is {check.detail}; to fix: {check.fix}"


def machine_checks() -> list[MachineCheck]:
    """Every need, in order; the namespace check runs only when bubblewrap is there."""
    checks = [check_bubblewrap()]
    if checks[0].ok:
        checks.append(check_user_namespaces(bwrap_path()))
    else:
        checks.append(userns_restriction() or MachineCheck(
            "user namespaces", False, "not tried: no usable bubblewrap",
            fix="install bubblewrap 0.8.0 or newer first"))  # fmt: skip
    checks.append(check_seccomp_notify())
    checks.append(check_cgroups())
    checks.append(check_address_randomization())
    return checks


def machine_facts() -> dict[str, object]:
    """What a report about this machine should say: kernel, architecture, user, tools."""
    bwrap = shutil.which("bwrap")
    return {
        "kernel": platform.release(),
        "arch": platform.machine(),
        "uid": os.geteuid(),
        "python": sys.version.split()[0],
        "bwrap": bwrap,
        "bwrap_version": bwrap_version(bwrap) if bwrap else None,
        "unprivileged_userns_clone": _read(USERNS_CLONE),
        "max_user_namespaces": _read(MAX_USERNS),
        "apparmor_restrict_unprivileged_userns": _read(APPARMOR_USERNS),
        "seccomp_actions": _read(SECCOMP_ACTIONS),
        "randomize_va_space": _read(RANDOMIZE_VA_SPACE),
    }


def setup_failure_hint() -> str | None:
    """Why bubblewrap may have failed to set a sandbox up, from the kernel's settings and
    bubblewrap's version (cheap: no sandbox is tried): the remedy, or None when they allow it."""
    restriction = userns_restriction()
    if restriction is not None:
        return f"{restriction.detail}: {restriction.fix}"
    bwrap = check_bubblewrap()
    if not bwrap.ok:
        return f"{bwrap.detail}: {bwrap.fix}"
    if _version(platform.release())[:2] < MIN_KERNEL:
        return f"Linux {platform.release()} has no seccomp user notification (5.5 or newer)"
    return None
