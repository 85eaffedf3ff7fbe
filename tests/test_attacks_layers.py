"""Attacks on layered worktrees (as root): the shared base checkout, what a run's layer says it
changed, runs beside each other, faults while a base is made, and the walk kept per base.

Every test runs the real `gatekeeper run` (real bubblewrap, a real repository) and fails when
the hole it names is open.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gatekeeper.run import layers

from conftest import git, gk, make_repo, needs_bwrap
from helpers import run_json, user_visible_state

pytestmark = [
    needs_bwrap,
    pytest.mark.sandbox,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="only root mounts overlays"),
]

FILES = {
    "a/one.txt": "1\n", "a/deep/er/z.txt": "z\n", "a/deep/x.txt": "x\n", "b/y.txt": "y\n",
    "c/w.sh": "#!/bin/sh\n", "d/1.txt": "1\n", "d/2.txt": "2\n",
}  # fmt: skip


def overlay_mounts() -> list[str]:
    """Mount points of the overlays mounted here, unescaped (a space is \\040 in mountinfo)."""
    with open("/proc/self/mountinfo", "rb") as f:
        points = [line.split(b" ")[4] for line in f if b" - overlay " in line]
    octal = re.compile(rb"\\([0-7]{3})")
    return [os.fsdecode(octal.sub(lambda m: bytes([int(m[1], 8)]), p)) for p in points]


@pytest.fixture(autouse=True)
def no_mount_outlives_the_test(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield
    for point in reversed(overlay_mounts()):
        if point.startswith(str(tmp_path.parent)):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def worktrees(home_data: str | None = None) -> Path:
    return Path(home_data or os.environ["XDG_DATA_HOME"]) / "gatekeeper" / "worktrees"


def bases(root: Path | None = None) -> list[Path]:
    root = root or worktrees()
    return sorted(p for p in root.glob("*/.bases/*") if p.is_dir())


def tree_repo(path: Path, files: dict[str, str] | None = None) -> Path:
    make_repo(path, files=files or FILES)
    return path


def commit_of(repo: Path, *argv: str, env: dict[str, str] | None = None) -> dict[str, object]:
    proc, data = run_json(repo, *argv, env=env)
    assert proc.returncode == 0 and data is not None, proc.stderr
    return data


def result_tree(repo: Path, data: dict[str, object]) -> str:
    return git(repo, "rev-parse", f"{data['commit']}^{{tree}}").strip()


def test_a_repository_folder_with_a_space_keeps_the_base_a_mounted_worktree_uses(
    tmp_path: Path, key: Path
) -> None:
    """Mount points and layer paths come escaped in /proc/self/mountinfo (a space is \\040):
    read as they are, no base looked mounted, and the next run on another base removed the
    base under a mounted worktree (its files vanished) while discard left the mount."""
    repo = tree_repo(tmp_path / "my repo")
    first = commit_of(repo, "sh", "-c", "echo first >> a/one.txt")
    worktree = Path(str(first["worktree"]))
    assert str(worktree) in overlay_mounts()
    # The launcher finds the run's layer (else git compares the whole worktree every time).
    assert layers.touched(worktree) == ["a/one.txt"]
    (repo / "b" / "y.txt").write_text("main moved\n")
    git(repo, "commit", "-qam", "main moves")
    commit_of(repo, "true")  # another base: clean-up of unused bases runs here
    assert len(bases()) == 2, bases()
    # The first run's worktree still shows its base's files beside its own write.
    assert (worktree / "a" / "deep" / "x.txt").read_text() == "x\n"
    assert (worktree / "a" / "one.txt").read_text() == "1\nfirst\n"
    proc = gk("discard", "--repo", str(repo))
    assert proc.returncode == 0, proc.stderr
    assert not [p for p in overlay_mounts() if p.startswith(str(worktrees()))]
    assert not bases()


def test_a_launcher_killed_while_making_the_base_leaves_nothing_after_discard(
    tmp_path: Path, key: Path
) -> None:
    """kill -9 while the base is checked out: `discard` must remove the half-made checkout
    (it was kept for an hour, a whole checkout's worth of disk)."""
    files = {f"d{d}/f{f}.txt": f"{d} {f}\n" * 20 for d in range(120) for f in range(100)}
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "gc.auto", "0")  # no gc in the background changes .git mid-test
    tree_repo(repo, files)
    before = user_visible_state(repo)
    launcher = subprocess.Popen([sys.executable, "-m", "gatekeeper", "run", "--repo", str(repo),
                                 "--", "true"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and launcher.poll() is None:
            if list(worktrees().glob("*/.bases/.tmp-*/files/d1*")):
                break
            time.sleep(0.005)
    finally:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
    assert list(worktrees().glob("*/.bases/.tmp-*")), "not killed while the base was made"
    proc = gk("discard", "--repo", str(repo))
    assert proc.returncode == 0, proc.stderr
    left = [p.name for p in worktrees().glob("*/.bases/*") if not p.name.endswith(".lock")]
    assert left == [], left
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert user_visible_state(repo) == before
    data = commit_of(repo, "sh", "-c", "echo next > d0/f0.txt")
    assert git(repo, "show", f"{data['commit']}:d0/f0.txt") == "next\n"


def test_no_run_sees_another_runs_layer_or_the_base_through_a_shown_system_folder(
    repo: Path,
) -> None:
    """Every sandbox shows /usr, /etc, /opt (read-only). Worktrees kept below one of them
    (GATEKEEPER_WORKTREES=/opt/...) were shown with them: a run read the shared base, its
    index and walk, and another run's layer and worktree, its writes included."""
    root = Path(f"/opt/gatekeeper-attack-{os.getpid()}")
    env = {"GATEKEEPER_WORKTREES": str(root)}
    spy = ("cat /opt/gatekeeper-attack-*/*/.layers/*/upper/secret.txt "
           "/opt/gatekeeper-attack-*/*/2*/secret.txt > seen.txt 2>/dev/null;"
           "ls -a /opt/gatekeeper-attack-*/*/.bases/* >> seen.txt 2>/dev/null; true")  # fmt: skip
    try:
        first, _ = run_json(repo, "sh", "-c", "echo s3cret > secret.txt", env=env)
        second, data = run_json(repo, "sh", "-c", spy, env=env)
        if first.returncode == 0 or second.returncode == 0:
            assert first.returncode == second.returncode == 0, (first.stderr, second.stderr)
            assert data is not None
            seen = git(repo, "show", f"{data['commit']}:seen.txt")
            assert seen == "", seen
        else:  # refused before anything was made, saying why
            assert first.returncode == 2 and "every sandbox shows" in first.stderr, first.stderr
            assert not root.exists() or not any(root.rglob("*"))
    finally:
        for point in reversed(overlay_mounts()):
            if point.startswith(f"{root}/"):
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)


# The agent's attack on the files it was given, run by the agent, its child and its grandchild
# (level 0, 1, 2), each on its own copy (t0/, t1/, t2/) of the same files; attack-N.log says
# what each attempt gave.
ATTACK = r'''
"""Everything a process may try on the worktree's files; then it starts the next level."""
import ctypes, errno, fcntl, mmap, os, subprocess, sys

level = int(sys.argv[1]) if len(sys.argv) > 1 else 0
libc = ctypes.CDLL(None, use_errno=True)
log = open(f"attack-{level}.log", "w")
d = f"t{level}"


def tr(name, fn):
    try:
        fn()
        log.write(f"{name}: ok\n")
    except Exception as exc:
        log.write(f"{name}: {type(exc).__name__} {exc}\n")


def renameat2(a, b, flags):
    AT = -100
    if libc.renameat2(AT, a.encode(), AT, b.encode(), flags) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


def write_append():
    with open(f"{d}/append.txt", "a") as f:
        f.write("appended\n")


def tmpfile_linkat():
    fd = os.open(d, os.O_TMPFILE | os.O_WRONLY, 0o644)
    os.write(fd, b"tmpfile\n")
    os.link(f"/proc/self/fd/{fd}", f"{d}/tmpfile-new.txt", follow_symlinks=True)
    os.close(fd)


def tmpfile_over():
    fd = os.open(d, os.O_TMPFILE | os.O_WRONLY, 0o644)
    os.write(fd, b"tmpfile over\n")
    os.link(f"/proc/self/fd/{fd}", f"{d}/tmp-over.new", follow_symlinks=True)
    os.rename(f"{d}/tmp-over.new", f"{d}/over.txt")
    os.close(fd)


def hardlink_write():
    os.link(f"{d}/linked.txt", f"{d}/linked-2.txt")
    with open(f"{d}/linked-2.txt", "a") as f:
        f.write("via link\n")


def mmap_write():
    fd = os.open(f"{d}/mmap.txt", os.O_RDWR)
    m = mmap.mmap(fd, 4)
    m[0:4] = b"MMAP"
    m.flush()
    m.close()
    os.close(fd)


def ro_fd_tricks():
    fd = os.open(f"{d}/rofd.txt", os.O_RDONLY)
    for fn in (lambda: os.fchmod(fd, 0o777), lambda: os.utime(fd, (1, 1)),
               lambda: os.setxattr(fd, "user.x", b"1")):
        tr("  rofd", fn)
    tr("  rofd reopen", lambda: os.write(os.open(f"/proc/self/fd/{fd}", os.O_WRONLY), b"R"))
    tr("  rofd flags", lambda: fcntl.ioctl(fd, 0x40086602, bytes(8)))  # FS_IOC_SETFLAGS


def copy_range():
    src = os.open(f"{d}/append.txt", os.O_RDONLY)
    dst = os.open(f"{d}/copyrange.txt", os.O_WRONLY)
    os.copy_file_range(src, dst, 4, 0, 0)


def reflink():
    src = os.open(f"{d}/append.txt", os.O_RDONLY)
    dst = os.open(f"{d}/reflink.txt", os.O_WRONLY)
    fcntl.ioctl(dst, 0x40049409, src)  # FICLONE


def opath_proc():
    fd = os.open(f"{d}/opath.txt", os.O_PATH)
    w = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_TRUNC)
    os.write(w, b"through /proc\n")


def mount_it():
    if libc.mount(b"none", f"{d}".encode(), b"tmpfs", 0, None) != 0:
        raise OSError(ctypes.get_errno(), "mount")


def bind_it():
    if libc.mount(f"{d}/sub".encode(), f"{d}/bindtarget".encode(), None, 4096, None) != 0:
        raise OSError(ctypes.get_errno(), "bind")


attacks = [
    ("append", write_append),
    ("truncate", lambda: os.truncate(f"{d}/trunc.txt", 0)),
    ("chmod", lambda: os.chmod(f"{d}/chmod.txt", 0o700)),
    ("chown", lambda: os.chown(f"{d}/chown.txt", 0, 0)),
    ("utime", lambda: os.utime(f"{d}/utime.txt", (1, 1))),
    ("hardlink", hardlink_write),
    ("rename over", lambda: (open(f"{d}/new.tmp", "w").write("new\n"),
                             os.rename(f"{d}/new.tmp", f"{d}/renamed-over.txt"))),
    ("tmpfile", tmpfile_linkat),
    ("tmpfile over", tmpfile_over),
    ("xattr user", lambda: os.setxattr(f"{d}/xattr.txt", "user.k", b"v")),
    ("xattr opaque", lambda: os.setxattr(f"{d}/sub", "trusted.overlay.opaque", b"y")),
    ("xattr redirect", lambda: os.setxattr(f"{d}/sub", "trusted.overlay.redirect", b"/t9")),
    ("xattr dir opaque user", lambda: os.setxattr(f"{d}/sub", "user.overlay.opaque", b"y")),
    ("mkfifo", lambda: os.mkfifo(f"{d}/fifo")),
    ("mknod whiteout", lambda: os.mknod(f"{d}/wh.txt", 0o600 | 0o020000, 0)),
    ("rename whiteout", lambda: renameat2(f"{d}/rw-a.txt", f"{d}/rw-b.txt", 4)),
    ("rename exchange", lambda: renameat2(f"{d}/ex-a.txt", f"{d}/ex-b.txt", 2)),
    ("rename exchange dirs", lambda: renameat2(f"{d}/sub", f"{d}/sub2", 2)),
    ("mmap", mmap_write),
    ("rofd", ro_fd_tricks),
    ("copy_file_range", copy_range),
    ("reflink", reflink),
    ("opath", opath_proc),
    ("mount", mount_it),
    ("bind", bind_it),
    ("deep", lambda: open(f"{d}/" + "/".join(["deep"] * 20) + "/leaf.txt", "a").write("d\n")),
    ("deep rename", lambda: os.rename(f"{d}/deep", f"{d}/deep-moved")),
    ("rm", lambda: os.unlink(f"{d}/gone.txt")),
]
for name, fn in attacks:
    tr(name, fn)
log.close()
if level < 2:
    subprocess.run([sys.executable, __file__, str(level + 1)], check=False)
'''
ATTACKED = [
    "append.txt", "trunc.txt", "chmod.txt", "chown.txt", "utime.txt", "linked.txt",
    "renamed-over.txt", "over.txt", "xattr.txt", "sub/in.txt", "sub2/in2.txt", "rw-a.txt",
    "rw-b.txt", "ex-a.txt", "ex-b.txt", "mmap.txt", "rofd.txt", "copyrange.txt", "reflink.txt",
    "opath.txt", "bindtarget/b.txt", "/".join(["deep"] * 20) + "/leaf.txt", "gone.txt",
]  # fmt: skip


def attack_repo(path: Path) -> Path:
    files = {f"t{level}/{name}": f"original {name}\n" for level in range(3) for name in ATTACKED}
    files["attack.py"] = ATTACK
    return tree_repo(path, files)


def exact_state(root: Path) -> dict[str, tuple[object, ...]]:
    """Every entry under root: kind and mode, owner, size, links, times, xattrs, content."""
    state: dict[str, tuple[object, ...]] = {}
    for current, dirs, names in os.walk(root):
        for name in dirs + names:
            path = os.path.join(current, name)
            st = os.lstat(path)
            xattrs = sorted(os.listxattr(path, follow_symlinks=False))
            content = Path(path).read_bytes() if os.path.isfile(path) else b""
            state[os.path.relpath(path, root)] = (
                st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_nlink, st.st_ino,
                st.st_mtime_ns, st.st_ctime_ns, tuple(xattrs), content,
            )  # fmt: skip
    return state


def test_nothing_the_agent_child_or_grandchild_does_changes_the_shared_base(
    tmp_path: Path, key: Path
) -> None:
    """Writes, truncation, chmod/chown/utime, hard links, rename over, O_TMPFILE, xattrs
    (overlay's own included), mknod/mkfifo, renameat2 WHITEOUT/EXCHANGE, mmap,
    copy_file_range, FICLONE, /proc/self/fd reopening, mount and bind, deep paths: the shared
    checkout stays exactly as made (content, modes, owners, times, links, xattrs)."""
    repo = attack_repo(tmp_path / "repo")
    first = commit_of(repo, "true")  # makes the base
    [base] = bases()
    before = exact_state(base / "files")
    index, walk = (base / "index").read_bytes(), (base / "walk.json").read_bytes()
    data = commit_of(repo, "/usr/bin/python3", "attack.py")
    logs = [git(repo, "show", f"{data['commit']}:attack-{n}.log") for n in range(3)]
    for log in logs:  # the attacks ran, and the writes went through
        assert "append: ok" in log and "mmap: ok" in log and "hardlink: ok" in log, log
    assert exact_state(base / "files") == before
    assert (base / "index").read_bytes() == index and (base / "walk.json").read_bytes() == walk
    # A run after it starts from the base as committed.
    check = commit_of(repo, "sh", "-c", "cat t0/append.txt t2/mmap.txt > seen.txt; ls t1 > ls.txt")
    seen = git(repo, "show", f"{check['commit']}:seen.txt")
    assert seen == "original append.txt\noriginal mmap.txt\n", seen
    assert "gone.txt" in git(repo, "show", f"{check['commit']}:ls.txt")
    assert first["worktree"] != check["worktree"]


# Changes a layer records in ways other than a plain file: folders renamed (twice, and with
# changes inside), replaced by files and back, emptied and made again (opaque), swapped with
# symlinks, mode-only changes, content changed back, writes through a hard link, a .gitignore
# and .gitattributes the agent writes, and names git and shells treat specially.
SCENARIO = r"""
set -e
mv a x && mv x y && echo inner >> y/deep/er/z.txt && mv y/deep y/deep2
mv b/y.txt c/moved.txt && rm -rf b && echo now-a-file > b && rm b && mkdir b && echo y > b/y.txt
rm -rf d && mkdir d && echo 1 > d/1.txt
chmod +x c/w.sh && chmod -x c/w.sh && chmod +x c/w.sh
echo changed > e/same.txt && echo same > e/same.txt
ln e/keep.txt e/hard.txt && echo via-link >> e/hard.txt
rm f/link && mkdir f/link && echo in > f/link/x
rm -rf f/dir && ln -s ../e f/dir
printf '*.log\nign/\n' > .gitignore && echo l > e/x.log && mkdir ign && echo i > ign/i
printf 'e/*.txt text eol=crlf\n' > .gitattributes && printf 'a\r\nb\r\n' > e/crlf.txt
touch g/untouched.txt
mkdir names && cd names
echo 1 > 'sp ace' && echo 2 > 'new
line' && echo 3 > '*' && echo 4 > '[ab]' && echo 5 > '-dash' && echo 6 > ':(top)magic'
echo 7 > "$(printf 'bad\377name')" && echo 8 > '\\back'
cd .. && mv g 'g renamed' && echo more >> 'g renamed/untouched.txt'
"""

SCENARIO_FILES = {
    **FILES, "e/same.txt": "same\n", "e/keep.txt": "keep\n", "f/dir/in.txt": "in\n",
    "g/untouched.txt": "u\n",
}  # fmt: skip


def changes_of(data: dict[str, object]) -> list[tuple[object, ...]]:
    return sorted((c["status"], c["path"], c["old_path"], c["new_blob"], c["new_mode"])  # type: ignore[index]
                  for c in data["changes"])  # type: ignore[attr-defined]  # fmt: skip


def test_a_layered_run_commits_what_a_plain_checkout_would(tmp_path: Path, key: Path) -> None:
    """Every change the scenario makes is committed, and exactly as in a plain checkout of
    the same base (GATEKEEPER_OVERLAY=0): same tree, same changes, same ignored files."""
    repo = tree_repo(tmp_path / "repo", SCENARIO_FILES)
    # The default policy, with .gitattributes (a protected path) named writable.
    policy = repo / ".gatekeeper" / "policy.yaml"
    default = policy.read_text()
    policy.write_text(default.replace('write: ["**"]', 'write: ["**", ".gitattributes"]'))
    assert policy.read_text() != default
    os.symlink("../e", repo / "f" / "link")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a symlink, .gitattributes writable")
    layered = commit_of(repo, "sh", "-c", SCENARIO)
    plain = commit_of(repo, "sh", "-c", SCENARIO, env={"GATEKEEPER_OVERLAY": "0"})
    assert str(layered["worktree"]) in overlay_mounts()
    assert str(plain["worktree"]) not in overlay_mounts()
    assert result_tree(repo, layered) == result_tree(repo, plain)
    assert changes_of(layered) == changes_of(plain)
    assert layered["ignored"] == plain["ignored"]
    listing = git(repo, "ls-tree", "-r", "-z", "--name-only", str(layered["commit"]))
    paths = set(listing.split("\0"))
    for expected in ("y/deep2/er/z.txt", "names/sp ace", "names/new\nline", "names/*",
                     "names/-dash", "names/:(top)magic", "names/bad\udcffname", "b/y.txt",
                     "c/moved.txt", "f/link/x", "g renamed/untouched.txt", "e/hard.txt"):  # fmt: skip
        assert expected in paths, (expected, sorted(paths))
    assert "a/one.txt" not in paths and "g/untouched.txt" not in paths
    assert git(repo, "show", f"{layered['commit']}:e/hard.txt") == "keep\nvia-link\n"
    assert git(repo, "show", f"{layered['commit']}:g renamed/untouched.txt") == "u\nmore\n"
    mode = git(repo, "ls-tree", str(layered["commit"]), "c/w.sh").split()[0]
    assert mode == "100755"


def test_over_two_thousand_touched_paths_are_all_committed(tmp_path: Path, key: Path) -> None:
    """Past the layer's path limit git compares the whole worktree: nothing is lost there,
    and a change deep in an untouched folder next to it is seen too."""
    files = {f"many/f{n}.txt": f"{n}\n" for n in range(2100)}
    files["other/deep/keep.txt"] = "keep\n"
    repo = tree_repo(tmp_path / "repo", files)
    script = ("for f in many/*.txt; do echo x >> \"$f\"; done; mkdir new; "
              "for n in $(seq 1 50); do echo $n > new/$n; done; echo y >> other/deep/keep.txt")  # fmt: skip
    layered = commit_of(repo, "sh", "-c", script)
    plain = commit_of(repo, "sh", "-c", script, env={"GATEKEEPER_OVERLAY": "0"})
    assert result_tree(repo, layered) == result_tree(repo, plain)
    assert len(layered["changes"]) == 2100 + 50 + 1  # type: ignore[arg-type]


def write_policy(path: Path, read: list[str], write: list[str]) -> Path:
    path.write_text(json.dumps({"version": 1, "paths": {"read": read, "write": write}}))
    return path


def test_the_walk_kept_per_base_never_stands_for_another_worktree(
    tmp_path: Path, key: Path
) -> None:
    """The mount plan of a policy that binds files one by one (`a/*.txt`) comes from the walk
    kept beside the base. A walk taken where the plan created files (`notes/todo.md`), of
    another base, or of the base a resumed run started from would bind what is not there or
    leave out what is."""
    repo = tree_repo(tmp_path / "repo")
    narrow = write_policy(tmp_path / "narrow.json", ["a/*.txt", "b/**"], ["b/**"])
    creating = write_policy(tmp_path / "creating.json", ["a/*.txt", "b/**", "notes/**"],
                            ["b/**", "notes/todo.md"])  # fmt: skip
    show = "ls -a . a > b/seen.txt; cat a/*.txt >> b/seen.txt"
    # A plan that creates a file first, then one that creates nothing: the walk kept then
    # holds no notes/todo.md.
    proc, made = run_json(repo, "sh", "-c", "echo todo > notes/todo.md", policy=creating)
    assert proc.returncode == 0, proc.stderr
    assert git(repo, "show", f"{made['commit']}:notes/todo.md") == "todo\n"
    proc, data = run_json(repo, "sh", "-c", show, policy=narrow)
    assert proc.returncode == 0, proc.stderr
    seen = git(repo, "show", f"{data['commit']}:b/seen.txt")
    assert "notes" not in seen and "one.txt" in seen, seen
    [base] = bases()
    assert "notes" not in (base / "walk.json").read_text()
    # Now a walk is kept: a plan that creates a file must not take it.
    proc, made = run_json(repo, "sh", "-c", "echo again > notes/todo.md", policy=creating)
    assert proc.returncode == 0, proc.stderr
    assert git(repo, "show", f"{made['commit']}:notes/todo.md") == "again\n"
    # A run that adds a/new.txt, resumed: the resumed run's worktree (another base, the
    # result's tree) shows it, bound from that base's own walk.
    proc, first = run_json(repo, "sh", "-c", "echo new > a/new.txt")
    assert proc.returncode == 0, proc.stderr
    proc, resumed = run_json(repo, "sh", "-c", show, policy=narrow,
                             extra=["--resume", str(first["run_id"])])  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    seen = git(repo, "show", f"{resumed['commit']}:b/seen.txt")
    assert "new.txt" in seen and "new\n" in seen, seen
    # And the original base's walk still shows no new.txt to a run from it.
    proc, data = run_json(repo, "sh", "-c", show, policy=narrow)
    assert proc.returncode == 0, proc.stderr
    assert "new.txt" not in git(repo, "show", f"{data['commit']}:b/seen.txt")
    assert len(bases()) == 2


def test_runs_at_once_on_two_bases_keep_their_own_files_and_writes(
    tmp_path: Path, key: Path
) -> None:
    """Three runs share one base while a run on another base starts (and cleans up unused
    bases): each sees the base's files and its own writes only, to the end."""
    repo = tree_repo(tmp_path / "repo")
    script = 'echo "$0" >> a/one.txt; sleep 4; cat a/one.txt a/deep/x.txt > seen.txt'
    launchers = [
        subprocess.Popen([sys.executable, "-m", "gatekeeper", "run", "--repo", str(repo),
                          "--json", "--", "sh", "-c", script, name],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name in ("first", "second", "third")
    ]  # fmt: skip
    deadline = time.monotonic() + 120
    while len(list(worktrees().glob("*/.layers/*/upper/a/one.txt"))) < 3:
        assert time.monotonic() < deadline and all(p.poll() is None for p in launchers)
        time.sleep(0.05)
    (repo / "b" / "y.txt").write_text("main moved\n")
    git(repo, "commit", "-qam", "main moves")
    other = commit_of(repo, "sh", "-c", "echo other >> a/one.txt; cat a/one.txt > seen.txt")
    assert git(repo, "show", f"{other['commit']}:seen.txt") == "1\nother\n"
    for launcher, name in zip(launchers, ("first", "second", "third"), strict=True):
        out, err = launcher.communicate(timeout=300)
        assert launcher.returncode == 0, err
        data = json.loads(out)
        assert git(repo, "show", f"{data['commit']}:seen.txt") == f"1\n{name}\nx\n"
        assert git(repo, "show", f"{data['commit']}:b/y.txt") == "y\n"
    assert len(bases()) == 2


def assert_all_gone_after_discard(repo: Path, before: dict[str, str]) -> None:
    """discard leaves no mount, layer, worktree or base; git's list is clean; the user's
    checkout is as it was; the next run works."""
    proc = gk("discard", "--repo", str(repo))
    assert proc.returncode == 0, proc.stderr
    root = worktrees()
    assert not [p for p in overlay_mounts() if p.startswith(f"{root}/")]
    assert not [p for p in root.glob("*/.layers/*")], list(root.glob("*/.layers/*"))
    assert not [p for p in root.glob("*/2*")], list(root.glob("*/2*"))
    assert not [p for p in root.glob("*/.bases/*") if not p.name.endswith(".lock")]
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert user_visible_state(repo) == before
    data = commit_of(repo, "sh", "-c", "echo next >> a/one.txt")
    assert git(repo, "show", f"{data['commit']}:a/one.txt") == "1\nnext\n"


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace holds the launcher still")
@pytest.mark.parametrize(
    ("syscall", "reached"),
    [
        # Between `git worktree add` and the mount: the `.git` file already in the run's layer.
        ("mount", "*/.layers/*/upper/.git"),
        # After the mount, before the worktree's index is written (copied with sendfile).
        ("sendfile", "*/2*/a/one.txt"),
    ],
)
def test_a_launcher_killed_at_each_step_of_making_the_worktree_leaves_nothing_after_discard(
    tmp_path: Path, key: Path, syscall: str, reached: str
) -> None:
    """kill -9 of the launcher, held in the step's system call until it is killed."""
    repo = tree_repo(tmp_path / "repo")
    git(repo, "config", "gc.auto", "0")
    before = user_visible_state(repo)
    launcher = subprocess.Popen(
        ["strace", "-f", "-qq", "-o", "/dev/null", "-e", f"trace={syscall}",
         "-e", f"inject={syscall}:delay_enter=60000000",
         sys.executable, "-m", "gatekeeper", "run", "--repo", str(repo), "--", "true"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not list(worktrees().glob(reached)):
            assert time.monotonic() < deadline and launcher.poll() is None
            time.sleep(0.02)
        time.sleep(0.3)  # into the held call
        children = subprocess.run(["pgrep", "-P", str(launcher.pid)], capture_output=True,
                                  text=True, check=False).stdout.split()  # fmt: skip
        assert len(children) == 1, children
        os.kill(int(children[0]), signal.SIGKILL)
    finally:
        launcher.wait(timeout=60)
    if syscall == "mount":
        assert not [p for p in overlay_mounts() if p.startswith(str(worktrees()))]
    assert_all_gone_after_discard(repo, before)
    # The killed run's branch went with it; only the next run's is there.
    assert len(git(repo, "branch", "--list", "--format=%(refname)", "agent/*").split()) == 1


def test_two_launchers_making_the_same_base_at_once(tmp_path: Path, key: Path) -> None:
    """Both runs work from one base; no half-made copy is left; discard then clears all."""
    files = {f"d{d}/f{f}.txt": f"{d} {f}\n" for d in range(40) for f in range(100)}
    repo = tree_repo(tmp_path / "repo", {**FILES, **files})
    git(repo, "config", "gc.auto", "0")
    before = user_visible_state(repo)
    launchers = [
        subprocess.Popen([sys.executable, "-m", "gatekeeper", "run", "--repo", str(repo),
                          "--json", "--", "sh", "-c", f"echo {n} >> d0/f0.txt"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for n in range(2)
    ]  # fmt: skip
    for n, launcher in enumerate(launchers):
        out, err = launcher.communicate(timeout=300)
        assert launcher.returncode == 0, err
        data = json.loads(out)
        assert git(repo, "show", f"{data['commit']}:d0/f0.txt") == f"0 0\n{n}\n"
    assert len(bases()) == 1
    assert not list(worktrees().glob("*/.bases/.tmp-*"))
    assert_all_gone_after_discard(repo, before)


def test_a_disk_that_fills_while_the_base_is_made(tmp_path: Path, key: Path) -> None:
    """The run fails saying why, leaves nothing half-made, and works once there is room."""
    files = {f"d{d}/f{f}.txt": f"{d} {f}\n" * 40 for d in range(20) for f in range(100)}
    repo = tree_repo(tmp_path / "repo", {**FILES, **files})
    git(repo, "config", "gc.auto", "0")
    before = user_visible_state(repo)
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], check=True)
    try:
        env = {"GATEKEEPER_WORKTREES": str(disk / "wt")}
        proc, _ = run_json(repo, "true", env=env)
        assert proc.returncode != 0 and "No space left" in proc.stderr, proc.stderr
        left = [p.name for p in (disk / "wt").glob("*/.bases/*") if not p.name.endswith(".lock")]
        assert left == [] and not list((disk / "wt").glob("*/2*"))
        assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
        assert not git(repo, "branch", "--list", "agent/*").strip()
        assert user_visible_state(repo) == before
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        proc, data = run_json(repo, "sh", "-c", "echo roomy >> a/one.txt", env=env)
        assert proc.returncode == 0, proc.stderr
        assert git(repo, "show", f"{data['commit']}:a/one.txt") == "1\nroomy\n"
        proc = gk("discard", "--repo", str(repo), env=env)
        assert proc.returncode == 0, proc.stderr
        assert not [p for p in overlay_mounts() if p.startswith(f"{disk}/")]
    finally:
        for point in reversed(overlay_mounts()):
            if point.startswith(f"{disk}/"):
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, check=False)


@pytest.mark.skipif(shutil.which("unshare") is None, reason="unshare starts a mount namespace")
def test_a_base_in_use_by_a_launcher_in_another_mount_namespace_is_kept(
    tmp_path: Path, key: Path
) -> None:
    """A launcher in a mount namespace of its own (a service with private mounts, a
    container sharing the folder) mounts its worktree where no other launcher sees it.
    Judged by this namespace's mount table alone, its base looked unused: a run on another
    base, or discard, removed it under the live run, whose files vanished."""
    repo = tree_repo(tmp_path / "repo")
    script = 'echo "$0" >> a/one.txt; sleep 5; cat a/one.txt a/deep/x.txt > seen.txt'
    launcher = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-m", "gatekeeper", "run",
         "--repo", str(repo), "--json", "--", "sh", "-c", script, "apart"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while not list(worktrees().glob("*/.layers/*/upper/a/one.txt")):
        assert time.monotonic() < deadline and launcher.poll() is None
        time.sleep(0.05)
    (repo / "b" / "y.txt").write_text("main moved\n")
    git(repo, "commit", "-qam", "main moves")
    commit_of(repo, "true")  # another base: unused bases are cleaned up here
    proc = gk("discard", "--repo", str(repo))  # and here
    assert proc.returncode == 0, proc.stderr
    out, err = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, err
    data = json.loads(out)
    assert git(repo, "show", f"{data['commit']}:seen.txt") == "1\napart\nx\n"


# The agent's own commit of 1,100 files whose paths are 3,800 bytes long, made without one
# file in the worktree (its layer holds only small.txt): git's arguments would be 4 MB.
LONG_PATHS = r"""
set -e
blob=$(echo x | git hash-object -w --stdin)
part=$(printf 'd%.0s' $(seq 1 200))
long="$part"; for n in $(seq 1 18); do long="$long/$part"; done
n=0
while [ $n -lt 1100 ]; do n=$((n+1)); printf '100644 %s\t%s/f%s\n' "$blob" "$long" "$n"; done |
  git update-index --index-info
git -c user.name=a -c user.email=a@b commit -qm many
echo small > small.txt
"""


def test_names_the_agent_committed_never_overflow_the_launchers_git_command_line(
    tmp_path: Path, key: Path
) -> None:
    """The launcher named each path of the agent's commits to git as an argument beside the
    layer's: past the kernel's limit git never started, and the worktree's changes were
    dropped (a plain checkout committed them)."""
    repo = tree_repo(tmp_path / "repo")
    layered = commit_of(repo, "sh", "-c", LONG_PATHS)
    plain = commit_of(repo, "sh", "-c", LONG_PATHS, env={"GATEKEEPER_OVERLAY": "0"})
    assert not layered.get("launcher_errors"), layered.get("launcher_errors")
    assert git(repo, "show", f"{layered['commit']}:small.txt") == "small\n"
    assert result_tree(repo, layered) == result_tree(repo, plain)


def test_files_bound_one_by_one_are_written_in_the_runs_layer_only(
    tmp_path: Path, key: Path
) -> None:
    """Where the policy makes single files writable, each is bound into the sandbox on its
    own (from a descriptor opened in the worktree): a write, truncation, chmod or utime
    through such a bind lands in the run's layer, never in the shared base, and is committed
    as a plain checkout commits it."""
    repo = tree_repo(tmp_path / "repo")
    policy = write_policy(tmp_path / "files.json", ["**"], ["a/*.txt", "b/y.txt", "c/w.sh"])
    script = ("echo more >> a/one.txt; : > b/y.txt; chmod 755 b/y.txt; chmod 644 c/w.sh; "
              "touch -d 2001-01-01 a/one.txt; echo no > a/deep/x.txt || true")  # fmt: skip
    proc, layered = run_json(repo, "sh", "-c", script, policy=policy)
    assert proc.returncode == 0, proc.stderr
    [base] = bases()
    for rel, text in FILES.items():
        assert (base / "files" / rel).read_text() == text
    assert os.stat(base / "files" / "b" / "y.txt").st_mode & 0o777 == 0o644
    assert git(repo, "show", f"{layered['commit']}:a/one.txt") == "1\nmore\n"
    proc, plain = run_json(repo, "sh", "-c", script, policy=policy,
                           env={"GATEKEEPER_OVERLAY": "0"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert result_tree(repo, layered) == result_tree(repo, plain)
    assert changes_of(layered) == changes_of(plain)


# Inside the sandbox: every path the mount table names for the worktree's layers (the base,
# the run's own upper and work folders), the folders around them, and another run's layer.
REACH = r"""
import glob, os, re, sys
found = []
for line in open("/proc/self/mountinfo"):
    for key, value in re.findall(r"(lowerdir|upperdir|workdir)=([^,\s]+)", line):
        found.append(value.replace("\\040", " "))
targets = set()
for path in found:
    for up in (path, os.path.dirname(path), os.path.dirname(os.path.dirname(path))):
        targets.update({up, up + "/index", up + "/walk.json", up + "/files", up + "/../.layers"})
targets.update(glob.glob(os.path.dirname(os.path.dirname(found[0])) + "/*") if found else [])
targets.add(sys.argv[1])
reached = []
for target in sorted(targets):
    try:
        if os.path.isdir(target):
            reached.append(f"{target}: {sorted(os.listdir(target))[:3]}")
        else:
            with open(target, "rb") as f:
                reached.append(f"{target}: {f.read(20)!r}")
    except OSError:
        pass
open("reached.txt", "w").write("\n".join(reached) + "\n")
print(len(found), file=open("found.txt", "w"))
"""


def test_no_path_the_mount_table_names_reaches_a_layer_or_the_base(
    tmp_path: Path, key: Path
) -> None:
    """The sandbox's mount table names the base checkout and the layers: none of those
    folders, their index or walk, or another run's layer can be read or listed inside."""
    repo = tree_repo(tmp_path / "repo")
    first = commit_of(repo, "sh", "-c", "echo s3cret > secret.txt")
    other = worktrees().glob(f"*/.layers/{first['run_id']}/upper")
    [other_upper] = list(other)
    data = commit_of(repo, "/usr/bin/python3", "-c", REACH, str(other_upper))
    assert git(repo, "show", f"{data['commit']}:found.txt").strip() != "0"
    assert git(repo, "show", f"{data['commit']}:reached.txt") == "\n"
