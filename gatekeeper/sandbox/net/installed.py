"""Registries the installed package managers use, as they report them at run time.

Each tool on the launcher's PATH is asked, outside the sandbox, what it is configured to use
and what it falls back to: pip (its default index and file host, and its configuration), npm
(`npm config`), go (`go env GOPROXY GOSUMDB`), maven (the super-POM in the installed maven's
model builder, and the user's and the installation's settings.xml) and cargo (what cargo
itself recorded under CARGO_HOME: the hosts of the sparse indexes it has used and their
download hosts; cargo has no stable command that reports its built-in default offline, and
the source id `cargo metadata` shows for crates-io names a code forge's git host, not a
registry). No host is written here: every one comes from a tool or a file of the user's at
run time.

Each tool runs with a clean environment (the user's PATH and HOME and the tool's own
variables), in `/`, never in the repository (an agent can commit a project configuration
there), with a short timeout and without a terminal; a program that PATH finds in the run's
worktree (or through a relative PATH entry) is never run; a tool that is missing, fails or
times out adds nothing. Answers are kept for the life of the launcher process.

Asking them takes a while (an interpreter and pip's modules, node and npm), so the launcher
also keeps the answers of pip, npm and go on disk (see CACHE below), in the user's gatekeeper
folder, which no sandbox is shown. An entry is used only while everything it came from is
unchanged; otherwise the tools are asked again. A stale entry could only add a host to the
package registries (or leave one out), so it is never used: see `_inputs` and `_files_of`.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import zipfile
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from xml.etree import ElementTree

TIMEOUT = 5.0  # seconds per command; they only read their configuration
DEADLINE = 2 * TIMEOUT  # for all tools together
MAX_OUTPUT = 256 * 1024
MAX_FILE = 1024 * 1024
MAX_ENTRIES = 64  # per tool: a configuration that names more is cut short
MAX_CACHED = 16
Avoid = tuple[str, ...]  # folders (absolute, and real paths) no program is run from

# The launcher's variables a tool may see: where it lives, whose it is, and its own settings.
_KEEP = {
    "PATH", "HOME", "USER", "LOGNAME", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS", "XDG_DATA_HOME",
    "PYENV_ROOT", "PYENV_VERSION", "VIRTUAL_ENV", "CONDA_PREFIX", "JAVA_HOME", "MAVEN_HOME",
    "M2_HOME", "CARGO_HOME", "RUSTUP_HOME", "RUSTUP_TOOLCHAIN", "GOROOT", "GOPATH", "GOENV",
    "GOFLAGS", "NVM_DIR", "NODE_PATH",
}  # fmt: skip
_KEEP_PREFIXES = ("PIP_", "NPM_CONFIG_", "GOPROXY", "GOSUMDB", "GONOSUMDB", "GOPRIVATE",
                  "GONOPROXY", "CARGO_REGISTRIES_", "CARGO_REGISTRY_", "CARGO_SOURCE_")  # fmt: skip
# Never let asking a tool reach a network: no update checks, no toolchain downloads.
_QUIET = {
    "LC_ALL": "C.UTF-8",
    "GOTOOLCHAIN": "local",
    "npm_config_update_notifier": "false",
    "npm_config_logs_max": "0",  # nor leave log files behind in the user's HOME
    "COREPACK_ENABLE_NETWORK": "0",  # a package manager shim never fetches itself
    "COREPACK_ENABLE_DOWNLOAD_PROMPT": "0",
    "NO_UPDATE_NOTIFIER": "1",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "PIP_NO_INPUT": "1",
}

PIP_QUERY = """
try:
    from pip._internal.models.index import PyPI
    print(PyPI.simple_url)
    print(PyPI.file_storage_domain)
except Exception:
    pass
try:
    from pip._internal.configuration import Configuration
    conf = Configuration(isolated=False)
    conf.load()
    for key, value in conf.items():
        if key.rsplit(".", 1)[-1] in ("index-url", "extra-index-url", "find-links", "trusted-host"):
            print(value)
except Exception:
    pass
"""
# Appended to PIP_QUERY when the answer is to be cached: the files pip's answer came from
# (the interpreter, pip's own code and every configuration file pip looks for, there or not).
PIP_FILES = """
import sys
print("--gatekeeper-files--")
print(sys.executable)
try:
    import pip, pip._internal.models.index as index
    print(pip.__file__)
    print(index.__file__)
    from pip._internal.configuration import Configuration
    for _variant, files in Configuration(isolated=False).iter_config_files():
        for name in files:
            print(name)
except Exception:
    print("--gatekeeper-unknown--")
"""
FILES_MARK = "--gatekeeper-files--"
UNKNOWN_MARK = "--gatekeeper-unknown--"
Files = list[str | None]  # files an answer came from; None: an input that cannot be watched


def clean_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables a package manager is asked with: see _KEEP; never a proxy or a secret."""
    kept = {k: v for k, v in env.items() if k in _KEEP or k.upper().startswith(_KEEP_PREFIXES)}
    kept = {k: v for k, v in kept.items() if "AUTH" not in k.upper() and "TOKEN" not in k.upper()}
    return {**kept, **_QUIET}


def ask_tool(argv: list[str], env: Mapping[str, str], timeout: float = TIMEOUT) -> str | None:
    """argv's standard output, or None when it cannot run, fails or outlives timeout.

    Runs in `/`, in a session of its own (the whole group is killed on timeout).
    """
    try:
        proc = subprocess.Popen(
            argv, cwd="/", env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    except OSError:
        return None
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # Not reaped yet, so its pid still names its group: no other group can be hit.
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.kill()
        # A descendant that left the group may still hold the pipe: do not wait for its EOF.
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=1)
        if proc.stdout is not None:
            proc.stdout.close()
        proc.wait()
        return None
    if proc.returncode != 0:
        return None
    return out[:MAX_OUTPUT].decode("utf-8", "replace")


def _which(name: str, env: Mapping[str, str], avoid: Avoid = ()) -> str | None:
    path = env.get("PATH")
    if not path:  # shutil.which would look in the current directory
        return None
    found = shutil.which(name, path=path)
    if not found or not os.path.isabs(found) or is_under(found, avoid):
        return None
    return found


def is_under(path: str, avoid: Iterable[str]) -> bool:
    """True when path, or what it links to, lies in one of the folders in avoid (absolute)."""
    real = os.path.realpath(path)
    return any(
        p == a or p.startswith(a.rstrip("/") + "/")
        for p in (os.path.abspath(path), real)
        for a in avoid
    )


def _head(path: str, size: int = 256) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(size)
    except OSError:
        return b""


def _interpreter_of(script: str | None, env: Mapping[str, str], avoid: Avoid) -> str | None:
    """The python a `pip` script runs with, from its `#!` line (a wrapper that is not a
    python, such as a version manager's shim, gives None: its python3 is asked anyway)."""
    if script is None:
        return None
    line = _head(script).split(b"\n", 1)[0]
    if not line.startswith(b"#!"):
        return None
    words = line[2:].decode("utf-8", "replace").split()
    if words and os.path.basename(words[0]) == "env" and len(words) > 1:
        words = [_which(words[1], env, avoid) or ""]
    if words and os.path.basename(words[0]).startswith("python") and os.path.isabs(words[0]):
        return None if is_under(words[0], avoid) else words[0]
    return None


def _lines(text: str | None) -> list[str]:
    return [w for w in (text or "").split() if w]


def pip_registries(
    env: Mapping[str, str], avoid: Avoid = (), files: Files | None = None
) -> list[str]:
    """pip's default index and file host and its configured indexes, from each python that
    would run pip (python3, python, and the interpreters of the pip scripts on PATH).

    files, when given, gets the files the answer came from (see PIP_FILES).
    """
    pythons: list[str] = []
    for name in ("python3", "python"):
        found = _which(name, env, avoid)
        if found and found not in pythons:
            pythons.append(found)
    for name in ("pip3", "pip"):
        found = _interpreter_of(_which(name, env, avoid), env, avoid)
        if found and found not in pythons:
            pythons.append(found)
    entries: list[str] = []
    for python in pythons[:4]:
        if files is None:
            entries += _lines(ask_tool([python, "-c", PIP_QUERY], env))
            continue
        answer = ask_tool([python, "-c", PIP_QUERY + PIP_FILES], env)
        found, mark, read = (answer or "").partition(f"\n{FILES_MARK}\n")
        entries += _lines(found)
        if not mark or UNKNOWN_MARK in read:
            files.append(None)  # no answer, or one whose sources are unknown: not kept
        files += [line for line in read.splitlines() if line.startswith("/")]
    return entries


def npm_registries(
    env: Mapping[str, str], avoid: Avoid = (), files: Files | None = None
) -> list[str]:
    """npm's registry (configured or its default) and any per-scope registry.

    files, when given, gets the files the answer came from: npm's user and global
    configuration (as it reports them), the project configuration of `/` (where it runs),
    and npm's own package (its built-in configuration and version).
    """
    npm = _which("npm", env, avoid)
    if npm is None:
        return []
    # `config list --json` carries the defaults too; `config get` is for an npm whose list
    # cannot speak JSON.
    try:
        config = json.loads(ask_tool([npm, "config", "list", "--json"], env) or "null")
    except ValueError:
        config = None
    if not isinstance(config, dict):
        if files is not None:
            files.append(None)
        return _lines(ask_tool([npm, "config", "get", "registry"], env))
    if files is not None:
        files += [
            config[k] for k in ("userconfig", "globalconfig") if isinstance(config.get(k), str)
        ]
        files.append("/.npmrc")
        package = _npm_package(npm)
        files += [str(package / "npmrc"), str(package / "package.json")] if package else [None]
    return [
        v
        for k, v in config.items()
        if isinstance(v, str) and (k == "registry" or k.endswith(":registry"))
    ]


def _npm_package(npm: str) -> Path | None:
    """The folder of the npm package the npm command runs (holding its package.json)."""
    here = Path(os.path.realpath(npm)).parent
    for folder in (here, *list(here.parents)[:3]):
        try:
            manifest = json.loads(_read_small(folder / "package.json") or b"{}")
        except ValueError:
            continue
        if isinstance(manifest, dict) and manifest.get("name") == "npm":
            return folder
    return None


def go_registries(
    env: Mapping[str, str], avoid: Avoid = (), files: Files | None = None
) -> list[str]:
    """go's module proxies and checksum database (`direct` and `off` name no registry).

    GONOSUMDB and GOPRIVATE are module path patterns, not hosts: the modules they match are
    fetched `direct`, from wherever their paths point, which is arbitrary web.
    """
    go = _which("go", env, avoid)
    if go is None:
        return []
    query = [go, "env", "-json", "GOPROXY", "GOSUMDB", "GOENV", "GOROOT"]
    try:
        values = json.loads(ask_tool(query, env) or "{}")
    except ValueError:
        return []
    if not isinstance(values, dict):
        return []
    if files is not None:
        # go's answer comes from the environment, its own env file and its root's go.env.
        goenv, goroot = str(values.get("GOENV") or ""), str(values.get("GOROOT") or "")
        if goenv != "off":
            files.append(goenv if goenv.startswith("/") else None)
        files.append(f"{goroot}/go.env" if goroot.startswith("/") else None)
    entries = [p for p in re.split(r"[,|]", str(values.get("GOPROXY", ""))) if "://" in p]
    sumdb = str(values.get("GOSUMDB", "")).split()
    if sumdb and sumdb[0] != "off":
        # `name[+key] [url]`: the url if given, else the database's name is its host.
        entries.append(sumdb[1] if len(sumdb) > 1 else sumdb[0].split("+", 1)[0])
    return entries


def _xml_urls(data: bytes, tags: tuple[str, ...]) -> list[str]:
    try:
        root = ElementTree.fromstring(data)
    except ElementTree.ParseError:
        return []
    urls = []
    for element in root.iter():
        tag = element.tag.rsplit("}", 1)[-1]
        if tag not in tags:
            continue
        fields = {c.tag.rsplit("}", 1)[-1]: (c.text or "").strip() for c in element}
        # A blocked mirror (maven's own blocker of plain-http repositories) is never used.
        if fields.get("url") and fields.get("blocked", "").lower() != "true":
            urls.append(fields["url"])
    return urls


def _read_small(path: Path) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(MAX_FILE)
    except OSError:
        return b""


SUPER_POMS = ("org/apache/maven/model/pom-4.0.0.xml", "org/apache/maven/model/pom-4.1.0.xml")


def _super_pom_urls(maven_home: Path, tags: tuple[str, ...]) -> list[str]:
    """The repositories of the super-POM that every maven project inherits."""
    urls: list[str] = []
    jars = sorted(glob.glob(str(maven_home / "lib" / "maven-model-builder-*.jar")))
    jars += sorted(glob.glob(str(maven_home / "lib" / "maven-api-impl-*.jar")))
    for jar in jars[:4]:
        try:
            with zipfile.ZipFile(jar) as zf:
                for name in SUPER_POMS:
                    with contextlib.suppress(KeyError):
                        info = zf.getinfo(name)
                        if info.file_size <= MAX_FILE:
                            urls += _xml_urls(zf.read(info), tags)
        except (OSError, zipfile.BadZipFile):
            continue
    return urls


def maven_registries(env: Mapping[str, str], avoid: Avoid = ()) -> list[str]:
    """Maven's central repository from the installed maven's super-POM, and the repositories
    and mirrors of the installation's and the user's settings.xml."""
    mvn = _which("mvn", env, avoid)
    entries: list[str] = []
    tags = ("repository", "pluginRepository", "mirror")
    if mvn is not None:
        # The installation the mvn on PATH runs: where it links to, or where a wrapper says.
        homes = [Path(os.path.realpath(mvn)).parent.parent]
        homes += [Path(env[k]) for k in ("MAVEN_HOME", "M2_HOME") if env.get(k)]
        for maven_home in dict.fromkeys(h for h in homes if not is_under(str(h), avoid)):
            entries += _super_pom_urls(maven_home, tags)
            entries += _xml_urls(_read_small(maven_home / "conf" / "settings.xml"), tags)
    home = env.get("HOME")
    if home:
        entries += _xml_urls(_read_small(Path(home) / ".m2" / "settings.xml"), tags)
    return entries


def cargo_registries(env: Mapping[str, str], avoid: Avoid = ()) -> list[str]:
    """The hosts of the sparse indexes cargo has used, and the hosts it downloads crates from.

    `$CARGO_HOME/registry/index/<host>-<hash>/` is where cargo keeps each index it used, with
    the index's config.json (`dl`: where crates are downloaded) in it or in its `.cache`. A
    git index (a folder with `.git`) is left out: its host is a code forge, and making that a
    package registry would open all of it. `api` is for publishing, not for downloads.
    """
    home = env.get("CARGO_HOME") or (str(Path(env["HOME"]) / ".cargo") if env.get("HOME") else "")
    if not home or is_under(home, avoid):
        return []
    entries: list[str] = []
    try:
        folders = sorted(os.scandir(Path(home) / "registry" / "index"), key=lambda e: e.name)
    except OSError:
        return []
    for folder in folders[:16]:
        host, sep, digest = folder.name.rpartition("-")
        if not sep or not re.fullmatch(r"[0-9a-f]{16}", digest):
            continue
        if os.path.lexists(os.path.join(folder.path, ".git")):
            continue
        entries.append(host)
        for name in ("config.json", ".cache/config.json"):
            try:
                config = json.loads(_read_small(Path(folder.path) / name) or b"{}")
            except ValueError:
                continue
            if isinstance(config, dict) and isinstance(config.get("dl"), str):
                entries.append(config["dl"])
    return entries


TOOLS: dict[str, Callable[..., list[str]]] = {
    "pip": pip_registries,
    "npm": npm_registries,
    "go": go_registries,
    "maven": maven_registries,
    "cargo": cargo_registries,
}
# The tools whose answers are kept on disk: those that run a program. Maven's and cargo's are
# read from files here, which costs less than checking a cache entry would.
CACHED = ("pip", "npm", "go")
CACHE_VERSION = 1
CACHE_TTL = 24 * 3600.0  # seconds: an entry is also asked again after a day, whatever it says
# Programs whose identity is part of an entry: what runs for each tool, and what runs them.
PROGRAMS = ("python3", "python", "pip3", "pip", "npm", "node", "go")
_cache: dict[tuple[tuple[tuple[str, str], ...], Avoid], dict[str, list[str]]] = {}
_cache_lock = threading.Lock()


def tool_registries(
    env: Mapping[str, str], avoid: Iterable[Path] = (), cache: Path | None = None
) -> dict[str, list[str]]:
    """Each tool's registry entries (URLs or hosts), asked in parallel; cached per process,
    and in the file cache (when given) while everything the answers came from is unchanged.

    No program in avoid (the run's worktree) is run: an agent can commit one there.
    """
    folders = tuple(
        sorted({os.path.realpath(a) for a in avoid} | {os.path.abspath(a) for a in avoid})
    )
    clean = clean_env(env)
    if clean.get("PATH"):
        clean["PATH"] = os.pathsep.join(
            d
            for d in clean["PATH"].split(os.pathsep)
            if os.path.isabs(d) and not is_under(d, folders)
        )
    key = (tuple(sorted(clean.items())), folders)
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    inputs = _inputs(clean, folders) if cache is not None else ""
    kept = _load(cache, inputs) if cache is not None else None
    files: dict[str, Files] = {name: [] for name in CACHED}

    def one(name: str) -> list[str]:
        try:
            if name in CACHED and cache is not None:
                return TOOLS[name](clean, folders, files[name])[:MAX_ENTRIES]
            return TOOLS[name](clean, folders)[:MAX_ENTRIES]
        except Exception:  # a tool's odd answer never stops a run; it only adds registries
            files.get(name, []).append(None)
            return []

    asked = [name for name in TOOLS if kept is None or name not in CACHED]
    pool = ThreadPoolExecutor(max_workers=len(TOOLS), thread_name_prefix="gatekeeper-tools")
    futures = {name: pool.submit(one, name) for name in asked}
    # A tool that asks several interpreters may take a few timeouts; the run waits for one
    # deadline at most, and a late tool is killed by its own timeout, unheard.
    done, _ = wait(futures.values(), timeout=DEADLINE)
    pool.shutdown(wait=False)
    answers = {name: f.result() if f in done else [] for name, f in futures.items()}
    if kept is not None:
        answers.update({name: kept[name] for name in CACHED})
    elif cache is not None and all(futures[name] in done for name in CACHED):
        _store(cache, inputs, {name: answers[name] for name in CACHED}, files)
    answers = {name: answers[name] for name in TOOLS}
    with _cache_lock:
        if len(_cache) >= MAX_CACHED:  # one launcher asks with one environment; tests with many
            _cache.clear()
        _cache[key] = answers
    return answers


# --- the file cache ---------------------------------------------------------------------------


def _identity(path: str) -> list[object] | None:
    """What changes when a file is replaced, rewritten, moved or relinked; None if absent."""
    try:
        link = os.lstat(path)
        st = os.stat(path)
    except OSError:
        return None
    return [os.path.realpath(path), link.st_ino, link.st_ctime_ns,
            *(getattr(st, f) for f in ("st_dev", "st_ino", "st_mode", "st_size", "st_mtime_ns",
                                       "st_ctime_ns"))]  # fmt: skip


def _inputs(clean: Mapping[str, str], folders: Avoid) -> str:
    """A digest of what decides which programs answer and how: the tools' environment, the
    folders never run from, each program PATH finds (and the interpreter of a script, such as
    a version manager's shim) and the version files the usual version managers read."""
    programs: list[object] = []
    for name in PROGRAMS:
        found = _which(name, clean, folders)
        programs.append([name, found, _identity(found) if found else None])
        line = _head(found).split(b"\n", 1)[0] if found else b""
        if line.startswith(b"#!"):
            words = line[2:].decode("utf-8", "replace").split()
            runner = words[0] if words else ""
            if os.path.basename(runner) == "env" and len(words) > 1:
                runner = _which(words[1], clean, folders) or ""
            programs.append([runner, _identity(runner) if runner.startswith("/") else None])
    home = clean.get("HOME", "")
    pyenv = clean.get("PYENV_ROOT") or (f"{home}/.pyenv" if home.startswith("/") else "")
    versions = ["/.python-version", "/.tool-versions", "/.nvmrc", "/.node-version"]
    versions += [f"{pyenv}/version"] if pyenv.startswith("/") else []
    versions += [f"{home}/.tool-versions"] if home.startswith("/") else []
    state = [CACHE_VERSION, sorted(clean.items()), list(folders), programs,
             [[v, _identity(v)] for v in versions]]  # fmt: skip
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()


def _load(cache: Path, inputs: str) -> dict[str, list[str]] | None:
    """The kept answers, when the entry is for these inputs, young enough and every file it
    came from is as it was; None otherwise (the tools are then asked)."""
    try:
        entry = json.loads(_read_small(cache) or b"null")
        if not isinstance(entry, dict) or entry.get("inputs") != inputs:
            return None
        if not 0 <= time.time() - float(entry["time"]) < CACHE_TTL:
            return None
        for path, seen in entry["files"]:
            if _identity(path) != seen:
                return None
        answers = entry["answers"]
        if not all(isinstance(answers.get(n), list) for n in CACHED):
            return None
        return {n: [str(v) for v in answers[n]][:MAX_ENTRIES] for n in CACHED}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _store(
    cache: Path, inputs: str, answers: dict[str, list[str]], files: dict[str, Files]
) -> None:
    """Keep answers with what they came from; nothing is kept when a tool could not say."""
    every = [f for name in CACHED for f in files[name]]
    if any(f is None or not f.startswith("/") for f in every):
        return
    entry = {"inputs": inputs, "time": time.time(), "answers": answers,
             "files": [[f, _identity(f)] for f in dict.fromkeys(every) if f]}  # fmt: skip
    with contextlib.suppress(OSError):
        cache.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        partial = cache.with_name(f".{cache.name}.{os.getpid()}.{threading.get_ident()}")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(entry, fh)
        os.replace(partial, cache)
