"""The package managers' answers kept between runs: used only while what they came from is
unchanged, never when a stale entry could change which hosts are package registries."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from gatekeeper.sandbox.net import installed

NPM = """#!/bin/sh
echo x >> {count}
printf '{{"registry": "%s", "userconfig": "{userconfig}", "globalconfig": "{globalconfig}"}}' \
  "$(cat {userconfig})"
"""
PYTHON = """#!/bin/sh
echo x >> {count}
cat {pipconf}
echo --gatekeeper-files--
echo {pipconf}
"""


class Tools:
    """A fake npm (in a package folder of its own) and python3 on PATH, each counting its runs
    and answering from a configuration file."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.count = root / "count"
        self.userconfig = root / "npmrc"
        self.userconfig.write_text("https://npm-one.test/")
        self.pipconf = root / "pip.conf"
        self.pipconf.write_text("https://pip-one.test/simple\n")
        package = root / "npm-package"
        (package / "bin").mkdir(parents=True)
        (package / "package.json").write_text(json.dumps({"name": "npm"}))
        cli = package / "bin" / "npm-cli"
        cli.write_text(NPM.format(count=self.count, userconfig=self.userconfig,
                                  globalconfig=root / "global-npmrc"))  # fmt: skip
        cli.chmod(0o755)
        self.bin = root / "bin"
        self.bin.mkdir()
        (self.bin / "npm").symlink_to(cli)
        self.python = self.bin / "python3"
        self.python.write_text(PYTHON.format(count=self.count, pipconf=self.pipconf))
        self.python.chmod(0o755)
        self.cache = root / "state" / "registries.json"
        self.env = {"PATH": f"{self.bin}:/usr/bin:/bin", "HOME": str(root / "home")}

    def runs(self) -> int:
        return len(self.count.read_text().splitlines()) if self.count.exists() else 0

    def ask(self, env: dict[str, str] | None = None) -> dict[str, list[str]]:
        installed._cache.clear()  # a new launcher: only the file cache is left
        return installed.tool_registries(env or self.env, cache=self.cache)


@pytest.fixture
def tools(tmp_path: Path) -> Tools:
    return Tools(tmp_path)


def test_a_kept_answer_is_used_while_nothing_it_came_from_changed(tools: Tools) -> None:
    first = tools.ask()
    assert first["npm"] == ["https://npm-one.test/"]
    assert "https://pip-one.test/simple" in first["pip"]  # (and what a python in /usr/bin says)
    asked = tools.runs()
    assert asked == 2
    assert tools.ask() == first
    assert tools.runs() == asked  # answered from the file, nothing run
    assert tools.cache.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("which", ["userconfig", "pipconf"])
def test_a_changed_configuration_file_is_asked_again(tools: Tools, which: str) -> None:
    tools.ask()
    path: Path = getattr(tools, which)
    before = path.stat()
    # Same length, same modification time: only its change time (and content) tell.
    path.write_text(path.read_text().replace("one", "two"))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    found = tools.ask()
    assert "https://npm-two.test/" in found["npm"] or "https://pip-two.test/simple" in found["pip"]
    assert not {"https://npm-one.test/", "https://pip-one.test/simple"} & {
        *found["npm"],
        *found["pip"],
    } - ({"https://npm-one.test/"} if which == "pipconf" else {"https://pip-one.test/simple"})


def test_a_configuration_file_that_appears_is_asked_again(tools: Tools) -> None:
    tools.ask()
    # npm's global configuration was reported, and absent: creating it is a change.
    (tools.root / "global-npmrc").write_text("registry=https://npm-global.test/\n")
    asked = tools.runs()
    tools.ask()
    assert tools.runs() > asked


def test_another_program_on_path_or_another_environment_is_asked_again(tools: Tools) -> None:
    tools.ask()
    asked = tools.runs()
    earlier = tools.root / "earlier"
    earlier.mkdir()
    other = earlier / "python3"
    other.write_text(tools.python.read_text().replace("cat ", "echo https://pip-other.test/ #"))
    other.chmod(0o755)
    found = tools.ask(dict(tools.env, PATH=f"{earlier}:{tools.env['PATH']}"))
    assert "https://pip-other.test/" in found["pip"]
    assert "https://pip-one.test/simple" not in found["pip"]
    assert tools.runs() > asked
    asked = tools.runs()
    tools.ask(dict(tools.env, PIP_INDEX_URL="https://pip-env.test/simple"))
    assert tools.runs() > asked
    # A program replaced in place (same path) is another program too.
    tools.ask()  # one entry is kept: the one for the last environment asked with
    asked = tools.runs()
    tools.ask()
    assert tools.runs() == asked
    text = tools.python.read_text()
    tools.python.unlink()
    tools.python.write_text(text)
    tools.python.chmod(0o755)
    tools.ask()
    assert tools.runs() > asked


def test_an_answer_whose_sources_are_unknown_is_not_kept(tools: Tools) -> None:
    (tools.root / "npm-package" / "package.json").write_text(json.dumps({"name": "other"}))
    tools.ask()
    asked = tools.runs()
    tools.ask()
    assert tools.runs() == 2 * asked  # asked every time
    assert not tools.cache.exists()


def test_an_old_or_altered_entry_is_not_used(tools: Tools) -> None:
    tools.ask()
    asked = tools.runs()
    entry = json.loads(tools.cache.read_text())
    entry["time"] = time.time() - installed.CACHE_TTL - 1
    tools.cache.write_text(json.dumps(entry))
    tools.ask()
    assert tools.runs() > asked
    asked = tools.runs()
    tools.cache.write_text("{not json")
    assert tools.ask()["npm"] == ["https://npm-one.test/"]
    assert tools.runs() > asked


def test_without_a_cache_file_nothing_is_kept(tools: Tools) -> None:
    installed._cache.clear()
    installed.tool_registries(tools.env)
    installed._cache.clear()
    installed.tool_registries(tools.env)
    assert tools.runs() == 4 and not tools.cache.exists()
