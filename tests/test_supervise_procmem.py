"""What the supervisor reads of a process at every exec: its argv from its memory, its parent
from its pidfd, and the event lines it writes about it."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import random
import re
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gatekeeper.sandbox.supervise import procmem
from gatekeeper.sandbox.supervise.supervisor import _now, event_line

from conftest import needs_bwrap

# A process that lays out a NULL-terminated array of string pointers whose first entries sit
# at the end of one page and the rest at the start of the next, and prints its address.
ARRAY_AT_A_PAGE_END = """
import ctypes, mmap, sys, time
count, before = int(sys.argv[1]), int(sys.argv[2])
area = mmap.mmap(-1, (8 * count // mmap.PAGESIZE + 3) * mmap.PAGESIZE)
base = ctypes.addressof(ctypes.c_char.from_buffer(area))
words = [ctypes.create_string_buffer(f'word{i}'.encode()) for i in range(count)]
array = base + mmap.PAGESIZE - 8 * before
pointers = (ctypes.c_uint64 * (count + 1)).from_address(array)
for i, word in enumerate(words):
    pointers[i] = ctypes.addressof(word)
pointers[count] = 0
print(array, flush=True)
time.sleep(60)
"""


@pytest.fixture
def laid_out() -> Iterator[object]:
    children: list[subprocess.Popen[str]] = []

    def start(count: int, before: int) -> tuple[int, int]:
        child = subprocess.Popen([sys.executable, "-c", ARRAY_AT_A_PAGE_END, str(count),
                                  str(before)], stdout=subprocess.PIPE, text=True)  # fmt: skip
        children.append(child)
        assert child.stdout is not None
        return child.pid, int(child.stdout.readline())

    yield start
    for child in children:
        child.kill()
        child.wait()


@pytest.mark.parametrize(("count", "before"), [(0, 1), (1, 1), (2, 1), (5, 2), (700, 3)])
def test_an_argv_across_a_page_end_is_read_whole(laid_out, count: int, before: int) -> None:  # type: ignore[no-untyped-def]
    pid, array = laid_out(count, before)
    reader = procmem.MemoryReader()
    try:
        assert reader.string_array(pid, array) == [f"word{i}".encode() for i in range(count)]
    finally:
        reader.close()


def test_an_argv_as_long_as_the_kernel_takes_is_read_whole(laid_out) -> None:  # type: ignore[no-untyped-def]
    # 100,000 words: more than any fixed count of words, well within what an exec may pass.
    reader = procmem.MemoryReader()
    try:
        pid, array = laid_out(100_000, 1)
        assert len(reader.string_array(pid, array)) == 100_000
    finally:
        reader.close()


def test_an_argv_over_the_budget_is_refused(laid_out) -> None:  # type: ignore[no-untyped-def]
    # Each `wordN` costs its bytes, its NUL and its pointer: 700,000 of them are over 8 MiB.
    reader = procmem.MemoryReader()
    try:
        pid, array = laid_out(700_000, 1)
        with pytest.raises(OSError, match="arguments too long"):
            reader.string_array(pid, array)
    finally:
        reader.close()


def test_strings_on_many_pages_are_read_together_as_one_by_one(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """An environment's strings each on a page of its own, longer than what is read of each
    at once, across a page's end, or cut short by the end of the array's page: read together,
    they are what reading each by itself gives; a pointer to nothing fails the read."""
    rnd = random.Random(6)
    area = ctypes.create_string_buffer(200 * 4096)
    free = ctypes.addressof(area)  # where the next word may start
    words: list[bytes] = []
    pointers: list[int] = []
    for i in range(70):
        page = free + 4096 - free % 4096
        at = page + rnd.choice([0, 17, 4096 - 300, 4096 - 12, 4096 - 1])
        word = f"VAR{i}=".encode() + b"x" * rnd.choice([0, 5, 250, 251, 600, 5000])
        ctypes.memmove(at, word + b"\0", len(word) + 1)
        free = at + len(word) + 1
        words.append(word)
        pointers.append(at)
    array = (ctypes.c_uint64 * (len(pointers) + 1))(*pointers, 0)
    reader = procmem.MemoryReader()
    pid = os.getpid()
    try:
        for first in (0, 1, 2, 3, 40):
            together = reader.string_array(pid, ctypes.addressof(array), first)
            reader.close()
            assert together == (words[:first] if first else words), first
            with monkeypatch.context() as m:
                m.setattr(procmem, "BATCH_FROM", 1 << 20)
                assert reader.string_array(pid, ctypes.addressof(array), first) == together
            reader.close()
        array[35] = 8  # nothing is mapped at 8
        with pytest.raises(OSError):
            reader.string_array(pid, ctypes.addressof(array))
    finally:
        reader.close()


def test_the_words_asked_for_are_read_and_no_further() -> None:
    """string_array(first=N) stops at the Nth pointer, also when it is a page's last and
    nothing is mapped after it; a string on a page read already in this notification is
    taken from that page (one view of it), the others read together."""
    import mmap

    area = mmap.mmap(-1, 3 * mmap.PAGESIZE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(area))
    words = [ctypes.create_string_buffer(f"word{i}".encode(), 8192) for i in range(8)]
    pointers = (ctypes.c_uint64 * 4).from_address(base + mmap.PAGESIZE - 32)
    for i in range(4):
        pointers[i] = ctypes.addressof(words[i])
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mprotect(ctypes.c_void_p(base + mmap.PAGESIZE), mmap.PAGESIZE, 0) == 0
    reader = procmem.MemoryReader()
    pid = os.getpid()
    try:
        array = base + mmap.PAGESIZE - 32
        assert reader.string_array(pid, array, first=4) == [b"word0", b"word1", b"word2", b"word3"]
        reader.close()
        with pytest.raises(OSError):
            reader.string_array(pid, array)  # no NULL before the page nothing is mapped in
        reader.close()
        assert reader.string(pid, ctypes.addressof(words[2])) == b"word2"  # its page, read
        ctypes.memmove(words[2], b"later", 6)
        assert reader.string_array(pid, array, first=4) == [b"word0", b"word1", b"word2", b"word3"]
    finally:
        reader.close()
        assert libc.mprotect(ctypes.c_void_p(base + mmap.PAGESIZE), mmap.PAGESIZE, 3) == 0
        del pointers
        area.close()


def test_the_parent_from_a_pidfd_is_the_parent_in_the_stat_file() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        pidfd = os.pidfd_open(child.pid)
        try:
            parent = procmem.pidfd_parent(pidfd)
        finally:
            os.close(pidfd)
        # 0 only on kernels without PIDFD_GET_INFO; then the stat file is read instead.
        assert parent in (os.getpid(), 0)
        assert procmem.parent_pid(child.pid) == os.getpid()
    finally:
        child.kill()
        child.wait()


def test_a_cmdline_held_from_before_an_exec_shows_the_new_programs_argv() -> None:
    """The check after an allowed exec reads the argv through a descriptor of the process's
    cmdline taken while the exec went on: a read shows what the process runs at the time of
    the read, as a read by name does, and nothing once the process is gone."""
    go_r, go_w = os.pipe()
    program = "import os, sys; os.read(int(sys.argv[1]), 1); os.execvp('sleep', ['x' * 5000, '30'])"
    child = subprocess.Popen([sys.executable, "-c", program, str(go_r)], pass_fds=[go_r])
    os.close(go_r)
    fd = os.open(f"/proc/{child.pid}/cmdline", os.O_RDONLY | os.O_CLOEXEC)
    try:
        deadline = time.monotonic() + 10
        while b"import os" not in (procmem.read_open(fd, 1 << 20) or b""):
            assert time.monotonic() < deadline  # (Popen is back before the arguments are set)
            time.sleep(0.01)
        before = os.stat(f"/proc/{child.pid}/exe")
        os.write(go_w, b"g")
        while os.stat(f"/proc/{child.pid}/exe").st_ino == before.st_ino:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        want = b"x" * 5000 + b"\x0030\x00"  # (over a page: read in parts)
        while procmem.read_open(fd, 1 << 20) != want:  # (the arguments written a moment later)
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert procmem.read_proc(f"/proc/{child.pid}/cmdline", 1 << 20) == want
        assert procmem.read_open(fd, 4200) == want[:4201]  # up to limit + 1, as read_proc
        child.kill()
        child.wait()
        assert not procmem.read_open(fd, 1 << 20)
    finally:
        os.close(fd)
        os.close(go_w)
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_process_whose_first_thread_ended_has_no_layout() -> None:
    """A first thread that ended (SYS_exit) while another thread goes on has no address
    space: its stat file shows every layout field 0, which is no layout (None), not one that
    two such reads would find alike; the thread still running shows the real one."""
    sys_exit = {"x86_64": 60, "aarch64": 93}.get(os.uname().machine)
    if sys_exit is None:
        pytest.skip("SYS_exit's number on this machine is not known here")
    program = (
        "import ctypes, threading, time\n"
        "threading.Thread(target=time.sleep, args=(30,)).start()\n"
        f"ctypes.CDLL(None).syscall({sys_exit}, 0)\n"  # SYS_exit: the first thread only
    )
    child = subprocess.Popen([sys.executable, "-c", program])
    try:
        deadline = time.monotonic() + 10
        while procmem.layout(f"/proc/{child.pid}") is not None:
            assert time.monotonic() < deadline, "the first thread never ended"
            time.sleep(0.01)
        others = [t for t in os.listdir(f"/proc/{child.pid}/task") if t != str(child.pid)]
        assert others
        shown = procmem.layout(f"/proc/{child.pid}/task/{others[0]}")
        assert shown is not None and any(field != b"0" for field in shown)
    finally:
        child.kill()
        child.wait()


def test_a_layout_the_kernel_hides_is_told_apart(tmp_path: Path) -> None:
    """A process that is not dumpable shows a reader without the right to trace it the same
    layout whatever it runs (code at 1 to 1, every other field 0): LAYOUT_HIDDEN, which no
    exec is told through by (a thread's exec read so before is refused), and which differs
    from every layout shown (one read so after an exec is another address space)."""
    program = (
        "import ctypes, sys, time\n"
        "ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)\n"  # PR_SET_DUMPABLE 0
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
    )
    target = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE)
    try:
        assert target.stdout is not None and target.stdout.readline() == b"ready\n"
        # Root may trace anything: the read is made as nobody, to whom root's process is
        # hidden; another user reads its own process, not dumpable.
        as_other = {"user": 65534, "group": 65534} if os.geteuid() == 0 else {}
        shown = subprocess.run(["cat", f"/proc/{target.pid}/stat"], capture_output=True,
                               check=True, **as_other).stdout  # fmt: skip
        fields = shown.rpartition(b")")[2].split()
        assert fields[23:26] + fields[42:49] == [b"1", b"1"] + [b"0"] * 8, shown
        (tmp_path / "stat").write_bytes(shown)
        assert procmem.layout(str(tmp_path)) == procmem.LAYOUT_HIDDEN
        # (nothing will show the arguments placed: they are judged as unreadable)
        assert procmem.arguments_placed(str(tmp_path)) is True
        if os.geteuid() == 0:
            shown_to_root = procmem.layout(f"/proc/{target.pid}")
            assert shown_to_root is not None and shown_to_root != procmem.LAYOUT_HIDDEN
    finally:
        target.kill()
        target.wait()


def random_text(rnd: random.Random) -> str:
    alphabet = ['"', "\\", "\n", "\x00", "\x7f", "é", "\u2028", "\udcff", "💥", "a", " ", "/"]
    return "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 12)))


def test_an_event_line_is_the_json_of_the_event() -> None:
    rnd = random.Random(7)
    for _ in range(500):
        event: dict[str, object] = {"t": random_text(rnd)}
        for key in ("pid", "argv", "cwd", "exe", "rule", "unreadable", "other"):
            event[key] = rnd.choice([
                None, True, False, rnd.randint(-5, 1 << 40), random_text(rnd),
                [random_text(rnd) for _ in range(rnd.randint(0, 3))], [1, "x"], 1.5,
                {"a": random_text(rnd)},
            ])  # fmt: skip
        line = event_line(event)
        assert line == json.dumps(event, ensure_ascii=True) + "\n"
        assert line.isascii() and json.loads(line) == event


def test_the_time_of_an_event_is_now_to_the_millisecond_in_utc() -> None:
    before = datetime.now(UTC)
    stamp = _now()
    after = datetime.now(UTC)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", stamp), stamp
    moment = datetime.fromisoformat(stamp)
    assert before.replace(microsecond=before.microsecond // 1000 * 1000) <= moment <= after
    time.sleep(1.1)  # the next second is formatted anew
    assert datetime.fromisoformat(_now()) > moment


CHANGING = """
import ctypes, sys
word = ctypes.create_string_buffer(b'before', 16)
print(ctypes.addressof(word), flush=True)
sys.stdin.readline()
ctypes.memmove(word, b'after\\0', 6)
print('changed', flush=True)
sys.stdin.readline()
"""


def test_memory_is_read_anew_for_each_notification() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHANGING], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert child.stdin is not None and child.stdout is not None
    reader = procmem.MemoryReader()
    try:
        addr = int(child.stdout.readline())
        assert reader.string(child.pid, addr) == b"before"
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline() == "changed\n"
        reader.close()  # the end of a notification
        assert reader.string(child.pid, addr) == b"after"
    finally:
        reader.close()
        child.kill()
        child.wait()


def test_a_lookup_in_a_process_root_tells_nothing_there_from_a_plain_path(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """procmem.lookup: the errno an exec of a path where nothing is gets; PLAIN only for a file
    reached without any link (its path, normalised, is what resolve gives); 0 for the rest."""
    import errno as e

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "prog").write_text("x")
    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "d")
    (tmp_path / "d" / "last").symlink_to("prog")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    pid = os.getpid()
    try:
        cases = {
            f"{tmp_path}/d/nothing": -e.ENOENT,
            f"{tmp_path}/nothing/prog": -e.ENOENT,
            f"{tmp_path}/file/prog": -e.ENOTDIR,
            f"{tmp_path}/d/prog": procmem.PLAIN,
            f"{tmp_path}//d/./prog": procmem.PLAIN,
            f"{tmp_path}/d/../d/prog": procmem.PLAIN,
            f"{tmp_path}/link/prog": 0,  # a link on the way
            f"{tmp_path}/d/last": 0,  # a link as the last part
            f"{tmp_path}/dangling": 0,  # a link to nothing is something
            f"{tmp_path}/link/nothing": 0,
            "/proc/self/exe": 0,  # a magic link
        }
        for path, expected in cases.items():
            assert procmem.lookup(pid, path) == expected, path
            if expected == procmem.PLAIN:
                assert procmem.resolve(pid, path) == "/" + os.path.normpath(path).lstrip("/")
    finally:
        for fd in procmem.forget_roots():
            os.close(fd)


def test_resolving_with_one_lookup_gives_what_reading_each_part_gives(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """procmem.resolve takes a path through no link from one kernel lookup (or its folder's,
    for a file not made yet): over random trees of folders, files and links (relative,
    absolute, dangling, in a loop) and random paths (`.`, `..`, `//`, missing parts, a slash
    at the end), it gives exactly what following the path part by part gives."""
    rnd = random.Random(11)
    base = tmp_path / "t"
    names = ["a", "b", "c"]
    pid = os.getpid()
    for _round in range(25):
        if base.exists():
            subprocess.run(["rm", "-rf", str(base)], check=True)
        base.mkdir()
        folders = [base]
        for _ in range(12):
            parent = rnd.choice(folders)
            child = parent / rnd.choice(names)
            if os.path.lexists(child):
                continue
            kind = rnd.random()
            if kind < 0.4:
                child.mkdir()
                folders.append(child)
            elif kind < 0.6:
                child.write_text("x")
            else:
                target = rnd.choice([
                    str(rnd.choice(folders)), "..", ".", "a", "../b", "nowhere", str(child),
                    str(base / "a" / "b"),
                ])  # fmt: skip
                child.symlink_to(target)
        for _ in range(40):
            parts = [rnd.choice([*names, ".", "..", "", "zz"]) for _ in range(rnd.randint(0, 5))]
            path = str(base) + "/" + "/".join(parts)
            for follow_last in (True, False):
                slow_root = os.open("/", os.O_PATH | os.O_DIRECTORY)
                try:
                    slow = procmem._resolve_in(
                        slow_root, [p for p in path.split("/") if p], follow_last
                    )
                finally:
                    os.close(slow_root)
                fast = procmem.resolve(pid, path, follow_last=follow_last)
                for fd in procmem.forget_roots():
                    os.close(fd)
                assert fast == slow, (path, follow_last, fast, slow)


@contextlib.contextmanager
def _sleeper(argv: list[str]) -> Iterator[int]:
    """bubblewrap (argv, up to its command) running sleep: the sleeping process's pid; killed
    at the end, and what the supervisor's reader learnt of its root forgotten."""
    outer = subprocess.Popen([*argv, "--", "/usr/bin/sleep", "60"])
    try:
        for _ in range(250):
            children = Path(f"/proc/{outer.pid}/task/{outer.pid}/children").read_text().split()
            with contextlib.suppress(OSError):
                if children and os.readlink(f"/proc/{children[0]}/exe").endswith("sleep"):
                    yield int(children[0])
                    return
            time.sleep(0.02)
        raise AssertionError("bubblewrap did not start")
    finally:
        outer.kill()
        outer.wait()
        procmem.forget_sandbox()


def _root_with_links(tmp_path: Path, links: dict[str, str]) -> list[str]:
    """bubblewrap's arguments for a root of its own: /usr bound, links at the root (those of
    a merged /usr that the host has, and links), a writable folder at /w."""
    (tmp_path / "w").mkdir(exist_ok=True)
    argv = ["bwrap", "--unshare-user", "--die-with-parent", "--tmpfs", "/",
            "--ro-bind", "/usr", "/usr", "--bind", str(tmp_path / "w"), "/w", "--proc", "/proc"]  # fmt: skip
    for name in ("lib64", "lib32"):
        if os.path.isdir(f"/usr/{name}"):
            links.setdefault(name, f"usr/{name}")
    for name, target in links.items():
        argv += ["--symlink", target, f"/{name}"]
    return argv


@pytest.fixture
def read_only_root(tmp_path) -> Iterator[tuple[int, dict[str, str]]]:  # type: ignore[no-untyped-def]
    """A process in a bubblewrap root that is read-only, as the sandbox's is, with links at
    the root (relative, absolute, to a folder not there, to another link, out of the root, to
    /proc). Yields its pid and the links made."""
    links = {"bin": "usr/bin", "lib": "/usr/lib", "nothing": "usr/nothing", "again": "bin",
             "back": "../usr/share", "self": "/proc/self/cwd"}  # fmt: skip
    with _sleeper([*_root_with_links(tmp_path, links), "--remount-ro", "/"]) as pid:
        yield pid, links


@needs_bwrap
@pytest.mark.sandbox
def test_paths_through_links_at_a_read_only_root_resolve_as_reading_each_part_does(
    read_only_root: tuple[int, dict[str, str]],
) -> None:
    """At the sandbox's set-up the links at its read-only root are learnt (those to /proc and
    to another link are left out); a path through one of them is then looked up as the path
    through its target: lookup and resolve give what following the path part by part gives,
    for present, missing and odd paths; another root (this process's) is left alone."""
    import errno as e

    pid, made = read_only_root
    learnt = procmem.share_sandbox_root(pid, outside=os.getpid())
    expected = {name: "/" + os.path.normpath("/" + target).lstrip("/")
                for name, target in made.items() if name not in ("self", "again")}  # fmt: skip
    assert learnt == expected
    rnd = random.Random(5)
    names = ["bin", "lib", "nothing", "again", "back", "usr", "w", "lib64"]
    words = ["true", "sh", "..", ".", "", "zz", "bin", "python3", "share"]
    paths = ["/bin/true", "/bin/nothing-here", "/bin/../lib", "/bin/", "/bin/.", "/bin",
             "/nothing/x", "/back/doc", "/w/x", "/lib/../bin/true", "/again/true"]  # fmt: skip
    paths += ["/" + "/".join([rnd.choice(names)] + [rnd.choice(words) for _ in range(rnd.randint(0, 3))])
              for _ in range(300)]  # fmt: skip
    root = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY)
    resolve_in_root = 0x10
    following = ctypes.create_string_buffer(
        struct.pack("=QQQ", os.O_PATH | os.O_CLOEXEC, 0, resolve_in_root), 24
    )
    try:
        for path in paths:
            for follow_last in (True, False):
                slow = procmem._resolve_in(root, [p for p in path.split("/") if p], follow_last)
                fast = procmem.resolve(pid, path, follow_last=follow_last)
                for fd in procmem.forget_roots():
                    os.close(fd)
                assert fast == slow, (path, follow_last, fast, slow)
            found = procmem.lookup(pid, path)
            for fd in procmem.forget_roots():
                os.close(fd)
            # The kernel's own answer for the path as given, links followed inside the root.
            kernel = procmem._lookup_in(root, path, following)
            if found in (-e.ENOENT, -e.ENOTDIR):
                assert found == kernel, (path, found, kernel)
            elif found == procmem.PLAIN:
                where = procmem._resolve_in(root, [p for p in path.split("/") if p], True)
                assert kernel == procmem.PLAIN and procmem.resolve(pid, path) == where, path
                for fd in procmem.forget_roots():
                    os.close(fd)
        assert procmem.lookup(pid, "/bin/true") == procmem.PLAIN  # the link is read no more
    finally:
        os.close(root)
    mine = os.getpid()  # another root: nothing is replaced
    assert procmem.through_root_links(procmem.root_of(mine), "/bin/true") == "/bin/true"
    for fd in procmem.forget_roots():
        os.close(fd)
    # Held as the root of every process but the one outside (here, this one): the same
    # answers from the held root, none of them opening a root of their own.
    procmem.share_sandbox_root(pid, outside=mine)
    held = procmem.root_of(pid)
    assert held >= 0 and procmem.root_of(pid + 1) == held
    assert os.path.samestat(os.fstat(held), os.stat(f"/proc/{pid}/root"))
    for path in paths:
        assert procmem.resolve(pid, path) == procmem.resolve(pid + 1, path), path
    assert procmem.forget_roots() == []
    assert procmem.through_root_links(procmem.root_of(mine), "/bin/true") == "/bin/true"
    opened = procmem.forget_roots()  # this process's own root was opened
    assert opened
    for fd in opened:
        os.close(fd)


@needs_bwrap
@pytest.mark.sandbox
def test_no_links_are_learnt_at_a_root_that_can_be_written(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Links at a root the sandbox could change are read anew at every lookup."""
    with _sleeper(_root_with_links(tmp_path, {"bin": "usr/bin", "lib": "usr/lib"})) as pid:
        assert procmem.share_sandbox_root(pid, outside=os.getpid()) == {}
        assert procmem.lookup(pid, "/bin/true") == 0  # through a link: not plain
        for fd in procmem.forget_roots():
            os.close(fd)


@needs_bwrap
@pytest.mark.sandbox
def test_a_root_link_whose_target_climbs_out_of_a_link_is_followed_as_the_kernel_does(
    tmp_path: Path,
) -> None:
    """A link at the read-only root whose target has `..` after a name (`up -> w/deep/..`)
    leads where the kernel goes: `..` from where w/deep leads (a link the sandbox can change),
    not from w, so it is not learnt as a shortcut and a path through it resolves part by part."""
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "deep").symlink_to("/usr/share/doc")
    links = {"up": "w/deep/..", "bin": "usr/bin", "lib": "usr/lib"}
    with _sleeper([*_root_with_links(tmp_path, links), "--remount-ro", "/"]) as pid:
        learnt = procmem.share_sandbox_root(pid, outside=os.getpid())
        assert "bin" in learnt
        root = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY)
        try:
            for path in ("/up/doc", "/up/x", "/up/doc/.."):
                slow = procmem._resolve_in(root, [p for p in path.split("/") if p], True)
                fast = procmem.resolve(pid, path)
                for fd in procmem.forget_roots():
                    os.close(fd)
                assert fast == slow, (path, fast, slow)
            assert procmem.resolve(pid, "/up/doc") == "/usr/share/doc"
        finally:
            os.close(root)
        for fd in procmem.forget_roots():
            os.close(fd)


def test_an_exec_lookup_opens_the_program_once_and_gives_back_what_nobody_took(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """lookup_program answers as lookup does; a plain file it found is opened in that same
    lookup and is what open_program gives for that path (no second open); one nobody took
    goes back with the roots at the notification's end; a file it may not read is still
    found (its open is refused, the lookup that reads nothing tells)."""
    import errno as e

    (tmp_path / "prog").write_text("#!/bin/sh\n")
    (tmp_path / "sealed").write_text("x")
    (tmp_path / "sealed").chmod(0o111)
    (tmp_path / "link").symlink_to("prog")
    pid = os.getpid()
    try:
        assert procmem.lookup_program(pid, f"{tmp_path}/nothing") == -e.ENOENT
        assert procmem.lookup_program(pid, f"{tmp_path}/prog/x") == -e.ENOTDIR
        assert procmem.lookup_program(pid, f"{tmp_path}/link") == 0
        assert procmem.lookup_program(pid, f"{tmp_path}//./prog") == procmem.PLAIN
        kept = procmem._opened[f"{tmp_path}/prog"]
        assert procmem.open_program(pid, f"{tmp_path}/prog") == kept
        assert os.read(kept, 2) == b"#!"
        os.close(kept)
        assert f"{tmp_path}/prog" not in procmem._opened  # taken: a second call opens anew
        again = procmem.open_program(pid, f"{tmp_path}/prog")
        assert again >= 0
        os.close(again)
        if os.geteuid() != 0:  # root reads whatever the mode says
            assert procmem.lookup_program(pid, f"{tmp_path}/sealed") == procmem.PLAIN
            assert f"{tmp_path}/sealed" not in procmem._opened
        assert procmem.lookup_program(pid, f"{tmp_path}/prog") == procmem.PLAIN
        left = procmem._opened[f"{tmp_path}/prog"]
    finally:
        given = procmem.forget_roots()
        for fd in given:
            os.close(fd)
    assert left in given and not procmem._opened


def test_a_file_looked_at_in_a_process_root_takes_absolute_links_inside_that_root(
    read_only_root: tuple[int, dict[str, str]], tmp_path: Path
) -> None:
    """stat_in_root follows an absolute link on the way inside the process's root (`/w/l ->
    /w` is that root's /w, which the supervisor's own root has not); exists_plain says a
    file is there only when no link is on the way."""
    pid, _ = read_only_root
    (tmp_path / "w" / "file").write_text("x")
    (tmp_path / "w" / "l").symlink_to("/w")
    assert not os.path.exists("/w/file")  # (the supervisor's root has no such file)
    try:
        st = procmem.stat_in_root(pid, "/w/l/file")
        assert st is not None and os.path.samestat(st, os.stat(tmp_path / "w" / "file"))
        assert procmem.stat_in_root(pid, "/w/l/nothing") is None
        link = procmem.stat_in_root(pid, "/w/l", follow_last=False)
        assert link is not None and stat.S_ISLNK(link.st_mode)
        assert procmem.exists_plain(pid, "/w/file") is True
        assert procmem.exists_plain(pid, "/w/l") is True  # a link as the last part is there
        assert procmem.exists_plain(pid, "/w/l/file") is False  # a link on the way
        assert procmem.exists_plain(pid, "/w/nothing") is False
    finally:
        for fd in procmem.forget_roots():
            os.close(fd)


def test_a_process_tree_is_claimed_only_by_pidfds_of_the_processes_found_in_it() -> None:
    """_kill_tree reads pids from /proc outside the sandbox's pid namespace: a pid taken over
    by another process in between (one of the user's own) is never signalled. A pid is
    claimed only as a child of the process it was found under, or, that one having ended
    (a zombie too), as a process of the sandbox's pid namespace."""
    from types import SimpleNamespace

    from gatekeeper.sandbox.supervise.supervisor import Supervisor

    here = SimpleNamespace(sandbox_pids=procmem.pid_namespace(os.getpid()))
    elsewhere = SimpleNamespace(sandbox_pids=(here.sandbox_pids or 0) + 1)
    claim = Supervisor._claim
    child = subprocess.Popen(["sleep", "30"])
    stranger = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    grandchild = 0
    try:
        time.sleep(0.2)
        grandchild = procmem.children(stranger.pid)[0]
        me = os.pidfd_open(os.getpid())
        try:
            # A child of the process it is found under: claimed.
            fd = claim(here, child.pid, me, os.getpid())  # type: ignore[arg-type]
            assert fd >= 0
            assert procmem.pidfd_alive(fd)
            os.close(fd)
            # Not a child of the live process it would be found under: refused.
            assert claim(here, grandchild, me, os.getpid()) == -1  # type: ignore[arg-type]
            # That process has ended, a zombie not yet reaped (its children handed on): one
            # of the sandbox's pid namespace is claimed, one of another is not.
            ended = subprocess.Popen(["true"])
            ended_fd = os.pidfd_open(ended.pid)
            os.waitid(os.P_PID, ended.pid, os.WEXITED | os.WNOWAIT)
            fd = claim(here, grandchild, ended_fd, ended.pid)  # type: ignore[arg-type]
            assert fd >= 0
            os.close(fd)
            assert claim(elsewhere, grandchild, ended_fd, ended.pid) == -1  # type: ignore[arg-type]
            ended.wait()
            os.close(ended_fd)
            # A pid with no process: nothing.
            assert claim(here, ended.pid, me, os.getpid()) == -1  # type: ignore[arg-type]
        finally:
            os.close(me)
    finally:
        for proc in (child, stranger):
            proc.kill()
            proc.wait()
        if grandchild:
            with contextlib.suppress(ProcessLookupError):
                os.kill(grandchild, 9)
