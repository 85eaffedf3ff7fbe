"""The selftest's scratch world: a temporary HOME with a repository, a key and secrets.

Everything lives in one temporary folder, laid out as a user's HOME is (the key in
~/.config/gatekeeper, worktrees in ~/.local/share/gatekeeper, the checkout in ~/src/repo,
credentials in dotfiles), and is removed afterwards. The environment points gatekeeper at it
for the duration only, so the user's own key, HOME and repositories are never touched. Beside
it run the host services the probes try to reach: a loopback port the policy allows, one it
does not, and Unix sockets where agent sockets live.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import socket
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from gatekeeper.commands import selftest_probe
from gatekeeper.git import git
from gatekeeper.policy.model import POLICY_PATH, TRUST_PATH
from gatekeeper.receipt.keys import generate_key
from gatekeeper.run import layers
from gatekeeper.run.worktree import remove_tree
from gatekeeper.sandbox.supervise.loader import interpreter_of

LEVELS = selftest_probe.LEVELS
HOOKS = selftest_probe.HOOKS
DENIED_PROGRAM = "touch"
DIRECT_HOST = "192.0.2.1"  # TEST-NET-1: never routed, even if something got out
DNS_SERVER = "192.0.2.53"
UNIX_PATH_MAX = 107  # sun_path holds 108 bytes with the NUL
DIRECT_PORTS = {"agent": 7001, "child": 7002, "grandchild": 7003}
# Secrets the launcher's environment holds during the run; none may reach the sandbox.
ENV_SECRETS = ("GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY",
               "GATEKEEPER_SELFTEST_SECRET")  # fmt: skip
# Credential files in the scratch HOME, by what they are.
HOME_SECRETS = {
    "ssh key": ".ssh/id_ed25519", "netrc": ".netrc", "aws credentials": ".aws/credentials",
    "git credentials": ".git-credentials", "npmrc": ".npmrc",
    "docker config": ".docker/config.json",
}  # fmt: skip

POLICY = """\
version: 1
paths:
  read: ["**"]
  write: ["out/**"]
commands:
  allow: []
  ask: []
  deny: ["{denied}"]
  default: allow
network:
  localhost: [{allowed_port}]
  package_registry: deny
  arbitrary_web: deny
  internal_services: deny
  registries: []
  grants: []
secrets:
  environment: stripped
  dotfiles: blocked
  credential_helpers: unavailable
limits:
  timeout: 60
"""


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Listener:
    """A host socket that counts the connections it accepts and greets each one."""

    def __init__(self, sock: socket.socket, greeting: bytes) -> None:
        self.sock = sock
        self.greeting = greeting
        self.accepted = 0
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True,
                                        name="gatekeeper-selftest-listener")  # fmt: skip
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            with conn, contextlib.suppress(OSError):
                conn.sendall(self.greeting)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


@dataclass
class Scratch:
    """Paths and values of one selftest's scratch world."""

    root: Path
    token: str
    home: Path
    keys: Path
    repo: Path
    worktrees: Path
    greeting: bytes
    env_secrets: dict[str, str] = field(default_factory=dict)
    secret_files: dict[str, Path] = field(default_factory=dict)
    outside: dict[str, Path] = field(default_factory=dict)
    listeners: dict[str, Listener] = field(default_factory=dict)
    unix_paths: dict[str, str] = field(default_factory=dict)
    made: list[Path] = field(default_factory=list)  # outside root, removed at the end

    @property
    def git_dir(self) -> Path:
        return self.repo / ".git"

    @property
    def key_path(self) -> Path:
        return self.keys / "signing_key.pem"

    @property
    def linger_marker(self) -> str:
        return f"gatekeeper-selftest-linger-{self.token}"

    def port(self, name: str) -> int:
        return int(self.listeners[name].sock.getsockname()[1])


def _tcp_listener(greeting: bytes) -> Listener:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return Listener(sock, greeting)


def _unix_listener(address: str, greeting: bytes) -> Listener:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(address)
    return Listener(sock, greeting)


def _runtime_dir(token: str) -> Path | None:
    """Where agent sockets really live (XDG_RUNTIME_DIR, else /run when writable)."""
    for base in (os.environ.get("XDG_RUNTIME_DIR"), "/run"):
        if base and os.path.isdir(base) and os.access(base, os.W_OK | os.X_OK):
            return Path(base) / f"gatekeeper-selftest-{token}"
    return None


def _start_services(s: Scratch) -> None:
    s.listeners["allowed"] = _tcp_listener(s.greeting)
    s.listeners["denied"] = _tcp_listener(s.greeting)
    scratch_sock = s.root / "agent.sock"
    if len(str(scratch_sock)) > UNIX_PATH_MAX:  # a long TMPDIR: /tmp, as ssh-agent would
        scratch_sock = Path("/tmp") / f"gatekeeper-selftest-{s.token}.sock"
        s.made.append(scratch_sock)
    sockets = {"scratch": str(scratch_sock), "abstract": f"\0{s.linger_marker}-sock"}
    runtime = _runtime_dir(s.token)
    if runtime is not None:
        runtime.mkdir(mode=0o700)
        s.made.append(runtime)
        sockets["runtime"] = str(runtime / "agent.sock")
    for name, address in sockets.items():
        s.listeners[f"unix.{name}"] = _unix_listener(address, s.greeting)
    s.unix_paths = sockets


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _make_repo(s: Scratch, policy_text: str) -> None:
    """The user's checkout: locked files per level, the write set, the probe and its config."""
    files = {"README.md": "# gatekeeper selftest\n", "out/.keep": ""}
    for level in LEVELS:
        for suffix in ("", "-sym", "-dd", "-hl"):
            files[f"locked/{level}{suffix}.txt"] = f"locked {level}{suffix}\n"
    config = {
        "checkout": str(s.repo), "git_dir": str(s.git_dir), "key": str(s.key_path),
        "home_file": str(s.home / ".bashrc"),
        "outside": {k: str(v) for k, v in s.outside.items()},
        "secret_files": {k: str(v) for k, v in s.secret_files.items()},
        "direct_ports": DIRECT_PORTS, "dns_server": DNS_SERVER,
        "loopback": {"allowed": s.port("allowed"), "denied": s.port("denied")},
        "unix": s.unix_paths, "denied_program": _denied_program(), "linger": s.linger_marker,
        "loader": interpreter_of(_denied_program()),
    }  # fmt: skip
    files["probe/probe.py"] = Path(selftest_probe.__file__).read_text()
    files["probe/config.json"] = json.dumps(config, indent=1, sort_keys=True) + "\n"
    files[POLICY_PATH] = policy_text
    key = generate_key()
    files[TRUST_PATH] = key.public.line + "\n"
    for name, text in files.items():
        _write(s.repo / name, text)
    # Not committed: a secret in the user's checkout, which the sandbox never shows.
    _write(s.repo / ".env", f"DATABASE_PASSWORD=selftest-{s.token}\n", 0o600)
    s.secret_files["checkout .env"] = s.repo / ".env"
    git("init", "-q", "-b", "main", str(s.repo))
    git("add", "--", *files, cwd=s.repo)
    git("-c", "user.name=gatekeeper selftest", "-c", "user.email=selftest@localhost",
        "-c", "commit.gpgsign=false", "commit", "-q", "-m", "selftest", cwd=s.repo)  # fmt: skip


def _denied_program() -> str:
    """The denied command's real path, for the probe's absolute-path attempt."""
    for folder in ("/usr/bin", "/bin"):
        path = os.path.join(folder, DENIED_PROGRAM)
        if os.access(path, os.X_OK):
            return os.path.realpath(path)
    return f"/usr/bin/{DENIED_PROGRAM}"


def probe_python() -> str:
    """The interpreter the probes run with: the system's, else gatekeeper's own."""
    for candidate in ("/usr/bin/python3", "/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    return sys.executable


@contextlib.contextmanager
def scratch_world(policy_text: str | None = None) -> Iterator[Scratch]:
    """Build the scratch world, point the environment at it, and undo both afterwards.

    policy_text replaces the battery's policy ({allowed_port} is filled in); tests use it to
    show that the battery notices a boundary that does not hold.
    """
    token = secrets.token_hex(6)
    root = Path(tempfile.mkdtemp(prefix="gatekeeper-selftest-")).resolve()
    home = root / "home"
    s = Scratch(root=root, token=token, home=home, keys=home / ".config" / "gatekeeper",
                repo=home / "src" / "repo",
                worktrees=home / ".local" / "share" / "gatekeeper" / "worktrees",
                greeting=f"gatekeeper-selftest-{token}\n".encode())  # fmt: skip
    saved = dict(os.environ)
    try:
        s.home.mkdir()
        _write(s.home / ".gitconfig", "[user]\n\tname = gatekeeper selftest\n"
               "\temail = selftest@localhost\n")  # fmt: skip
        for name, rel in HOME_SECRETS.items():
            _write(s.home / rel, f"{name}: selftest-secret-{token}\n", 0o600)
            s.secret_files[name] = s.home / rel
        if os.access("/etc/shadow", os.R_OK):
            s.secret_files["/etc/shadow"] = Path("/etc/shadow")
        _write(s.home / ".bashrc", f"# the user's own ({token})\n")
        for level in LEVELS:
            # Next to the checkout, in the folder that holds the user's projects.
            s.outside[level] = s.repo.parent / f"notes-{level}.txt"
            _write(s.outside[level], f"outside the repository ({level})\n")
        for name in [k for k in os.environ if k.startswith("GIT_")]:
            del os.environ[name]
        os.environ.update(
            HOME=str(s.home), GATEKEEPER_HOME=str(s.keys), GATEKEEPER_WORKTREES=str(s.worktrees),
            XDG_CONFIG_HOME=str(s.home / ".config"), XDG_DATA_HOME=str(s.home / ".local" / "share"),
        )  # fmt: skip
        s.env_secrets = {name: f"selftest-{name.lower()}-{token}" for name in ENV_SECRETS}
        _start_services(s)
        s.env_secrets["SSH_AUTH_SOCK"] = s.unix_paths["scratch"]
        os.environ.update(s.env_secrets)
        text = POLICY if policy_text is None else policy_text
        _make_repo(s, text.format(denied=DENIED_PROGRAM, allowed_port=s.port("allowed")))
        yield s
    finally:
        os.environ.clear()
        os.environ.update(saved)
        for listener in s.listeners.values():
            listener.close()
        layers.unmount_below(root)  # the run's worktree, when layered
        for path in s.made:
            remove_tree(path)
        remove_tree(root)
