"""The selftest's agent: tries every action of the battery from inside the sandbox.

Runs under whatever python3 the machine has, with the standard library only (gatekeeper is not
visible inside). `python3 probe/probe.py LEVEL` tries each action as the agent, then starts
itself as the child, which starts the grandchild. Each level writes what it saw to
out/LEVEL/result.json: for each action whether it succeeded and the error; file contents and
environment values only as SHA-256 digests, so nothing read lands in the result in clear.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time

LEVELS = ("agent", "child", "grandchild")
# A real hook name for each level, so each plants a hook git would run.
HOOKS = {"agent": "pre-commit", "child": "post-checkout", "grandchild": "pre-push"}


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Probe:
    def __init__(self, level: str, config: dict) -> None:  # type: ignore[type-arg]
        self.level = level
        self.config = config
        self.out = os.path.join("out", level)
        self.results: dict[str, dict[str, object]] = {}

    def attempt(self, name: str, action) -> None:  # type: ignore[no-untyped-def]
        """Run action; record whether it succeeded, what it returned and the error."""
        entry: dict[str, object] = {}
        try:
            value = action()
            entry["ok"] = True
            if value is not None:
                entry["value"] = value
        except Exception as exc:  # noqa: BLE001 (every failure is a result here)
            entry["ok"] = False
            entry["error"] = f"{type(exc).__name__}: {exc}"[:300]
        self.results[name] = entry

    # -- writes ------------------------------------------------------------------------------

    def append(self, path: str) -> None:
        with open(path, "a") as fh:
            fh.write(f"written by the selftest's {self.level}\n")

    def through_link(self, target: str, link: str) -> None:
        os.symlink(target, link)
        self.append(link)

    def through_hardlink(self, source: str, link: str) -> None:
        os.link(source, link)
        self.append(link)

    def writes(self) -> None:
        cfg, lv, out = self.config, self.level, self.out
        checkout, git_dir = cfg["checkout"], cfg["git_dir"]
        self.attempt("write.inside", lambda: self.append(os.path.join(out, "made.txt")))
        self.attempt("write.outside", lambda: self.append(f"locked/{lv}.txt"))
        self.attempt("write.create", lambda: open(f"locked/{lv}-new.txt", "x").close())
        self.attempt("write.symlink", lambda: self.through_link(
            f"../../locked/{lv}-sym.txt", os.path.join(out, "link")))  # fmt: skip
        self.attempt(
            "write.symlink_abs",
            lambda: self.through_link(
                os.path.join(checkout, "locked", f"{lv}-sym.txt"), os.path.join(out, "link-abs")
            ),
        )
        self.attempt("write.dotdot", lambda: self.append(f"{out}/../../locked/{lv}-dd.txt"))
        self.attempt("write.dotdot_escape", lambda: self.append(
            os.path.join(os.getcwd(), "..", f"selftest-{lv}-escape.txt")))  # fmt: skip
        self.attempt("write.hardlink", lambda: self.through_hardlink(
            f"locked/{lv}-hl.txt", os.path.join(out, "hardlink")))  # fmt: skip
        self.attempt("write.checkout", lambda: self.append(
            os.path.join(checkout, "locked", f"{lv}.txt")))  # fmt: skip
        self.attempt("write.outside_repo", lambda: self.append(cfg["outside"][lv]))
        # HOME is fresh inside: the user's file is not there, and a write stays inside.
        self.attempt("home.read", lambda: self.read(cfg["home_file"]))
        self.attempt("home.write", lambda: self.append(cfg["home_file"]))
        self.attempt("git.config", lambda: self.append(os.path.join(git_dir, "config")))
        self.attempt("git.hook", lambda: self.append(os.path.join(git_dir, "hooks", HOOKS[lv])))
        self.attempt("git.ref", lambda: self.append(
            os.path.join(git_dir, "refs", "heads", f"selftest-{lv}")))  # fmt: skip
        self.attempt("git.config_cli", lambda: self.run(
            ["git", "config", "core.hooksPath", f"/tmp/selftest-{lv}-hooks"]))  # fmt: skip

    def write_memory(self, path: str) -> None:
        with open(path, "r+b") as fh:
            fh.seek(0)

    # -- secrets -----------------------------------------------------------------------------

    def read(self, path: str) -> dict[str, object]:
        with open(path, "rb") as fh:
            data = fh.read(1 << 20)
        return {"sha256": digest(data), "size": len(data)}

    def environments(self) -> list[str]:
        """Digests of every environment value of every process this one can see."""
        seen = {digest(v.encode("utf-8", "surrogateescape")) for v in os.environ.values()}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    raw = fh.read(1 << 20)
            except OSError:
                continue
            for item in raw.split(b"\0"):
                if b"=" in item:
                    seen.add(digest(item.split(b"=", 1)[1]))
        return sorted(seen)

    def secrets(self) -> None:
        cfg = self.config
        self.attempt("secret.env_names", lambda: sorted(os.environ))
        self.attempt("secret.env_values", self.environments)
        for name, path in cfg["secret_files"].items():
            self.attempt(f"secret.file.{name}", lambda p=path: self.read(p))
        self.attempt("secret.key", lambda: self.read(cfg["key"]))
        self.attempt("secret.key_dir", lambda: os.listdir(os.path.dirname(cfg["key"])))

    # -- network -----------------------------------------------------------------------------

    def connect(self, host: str, port: int) -> str:
        with socket.create_connection((host, port), timeout=1) as sock:
            sock.settimeout(1)
            return sock.recv(200).decode("ascii", "replace")

    def dns(self, server: str) -> str:
        # A query for a name under .invalid: nothing real is asked even where it gets out.
        query = (b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
                 b"\x08selftest\x0agatekeeper\x07invalid\x00\x00\x01\x00\x01")  # fmt: skip
        family = socket.AF_INET6 if ":" in server else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.settimeout(0.5)
            sock.sendto(query, (server, 53))
            answer = sock.recv(512)
        return f"answer of {len(answer)} bytes"

    def via_proxy(self, host: str, port: int) -> str:
        proxy = os.environ.get("HTTP_PROXY") or os.environ.get("http_proxy") or ""
        where = proxy.split("://", 1)[-1].rstrip("/").rsplit(":", 1)
        with socket.create_connection((where[0], int(where[1])), timeout=2) as sock:
            sock.settimeout(2)
            sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
            status = sock.recv(200).split(b"\r\n", 1)[0].decode("ascii", "replace")
        if " 200 " not in status + " ":
            raise OSError(f"proxy answered {status!r}")
        return status

    def unix(self, path: str) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(1)
            sock.connect(path)
            return sock.recv(200).decode("ascii", "replace")

    def network(self) -> None:
        cfg, lv = self.config, self.level
        self.attempt("net.direct", lambda: self.connect("192.0.2.1", cfg["direct_ports"][lv]))
        servers = []
        try:
            with open("/etc/resolv.conf") as fh:
                servers = [line.split()[1] for line in fh if line.startswith("nameserver ")]
        except (OSError, IndexError):
            pass
        self.attempt("net.dns_servers", lambda: servers)
        for number, server in enumerate([*servers[:3], cfg["dns_server"]]):
            self.attempt(f"net.dns.{number}", lambda s=server: self.dns(s))
        loop = cfg["loopback"]
        self.attempt("net.loopback_allowed", lambda: self.connect("127.0.0.1", loop["allowed"]))
        self.attempt("net.loopback_denied", lambda: self.connect("127.0.0.1", loop["denied"]))
        self.attempt("net.loopback_proxy", lambda: self.via_proxy("127.0.0.1", loop["denied"]))
        for name, path in cfg["unix"].items():
            self.attempt(f"net.unix.{name}", lambda p=path: self.unix(p))

    # -- commands and processes --------------------------------------------------------------

    def run(self, argv: list[str]) -> int:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=20, check=False)  # fmt: skip
        if proc.returncode != 0:
            raise OSError(f"exit {proc.returncode}")
        return proc.returncode

    def commands(self) -> None:
        out, touch = self.out, self.config["denied_program"]
        marker = os.path.join(out, "denied")
        exec_it = "import os, sys; os.execv(sys.argv[1], sys.argv[1:])"
        self.attempt("cmd.name", lambda: self.run([os.path.basename(touch), f"{marker}-name"]))
        self.attempt("cmd.abs", lambda: self.run([touch, f"{marker}-abs"]))
        self.attempt("cmd.sh", lambda: self.run(["sh", "-c", f"touch {marker}-sh"]))
        self.attempt("cmd.env", lambda: self.run(["env", "touch", f"{marker}-env"]))
        self.attempt("cmd.interpreter", lambda: self.run(
            [sys.executable, "-c", exec_it, touch, f"{marker}-interpreter"]))  # fmt: skip
        self.attempt("cmd.shebang", lambda: self.run([self.script(f"#!{touch} {marker}-shebang")]))
        loader = self.config.get("loader")
        if loader:  # the dynamic loader asked to run the program (none for a static one)
            self.attempt("cmd.loader", lambda: self.run([loader, touch, f"{marker}-loader"]))
        self.attempt("cmd.allowed", lambda: self.run(
            ["sh", "-c", f"echo allowed > {out}/allowed.txt"]))  # fmt: skip

    def script(self, first_line: str) -> str:
        """A script in the write set whose `#!` line the kernel runs."""
        path = os.path.join(self.out, "shebang.sh")
        with open(path, "w") as fh:
            fh.write(first_line + "\n")
        os.chmod(path, 0o755)
        return path

    def linger(self) -> int:
        """Leave a process behind in a session of its own, past the end of the run."""
        marker = f"{self.config['linger']}-{self.level}"
        pid = os.fork()
        if pid == 0:
            try:
                os.setsid()
                if os.fork() == 0:
                    os.execv(sys.executable, [sys.executable, "-c",
                             "import time; time.sleep(120)", marker])  # fmt: skip
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        return pid

    def main(self) -> int:
        os.makedirs(self.out, exist_ok=True)
        started = time.monotonic()
        self.writes()
        self.secrets()
        self.network()
        self.commands()
        self.attempt("proc.linger", self.linger)
        self.attempt("proc.memory_parent", lambda: self.write_memory(f"/proc/{os.getppid()}/mem"))
        self.attempt("proc.memory_self", lambda: self.write_memory("/proc/self/mem"))
        index = LEVELS.index(self.level)
        if index + 1 < len(LEVELS):
            self.attempt("proc.next", lambda: self.run(
                [sys.executable, sys.argv[0], LEVELS[index + 1]]))  # fmt: skip
        report = {"level": self.level, "pid": os.getpid(), "results": self.results,
                  "seconds": round(time.monotonic() - started, 3)}  # fmt: skip
        with open(os.path.join(self.out, "result.json"), "w") as fh:
            json.dump(report, fh, indent=1, sort_keys=True)
        return 0


if __name__ == "__main__":
    with open(os.path.join("probe", "config.json")) as config_file:
        loaded = json.load(config_file)
    sys.exit(Probe(sys.argv[1], loaded).main())
