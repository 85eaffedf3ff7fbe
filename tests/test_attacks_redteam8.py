"""Attacks on the supervisor's check after an allowed exec.

Each runs a program the policy refuses (`atk evil`, `python3 evil`, `rm -rf`) by changing the
argv between what the supervisor reads and what the kernel copies, and asserts that the
refused program never had its effect and was recorded as refused.

The change is timed, not raced: the supervisor reads the program file (its `#!` line) after
it has read the argv and before it answers; the kernel copies the argv after the answer and
reads the file only after that. An inotify watch (IN_ACCESS) on the program file tells the
sandbox the moment the supervisor has read it, and the argument is flipped then: the flip
lands in the window at (nearly) every attempt.
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import git, make_repo, needs_bwrap
from helpers import run_json
from test_supervise import predicate, processes

pytestmark = [needs_bwrap, pytest.mark.sandbox]

ATK_POLICY = "commands: {deny: ['atk evil'], default: allow}\n"


def _build(tmp_path: Path, policy: str, source_text: str, defines: list[str]) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    repo = make_repo(tmp_path / "repo", policy=policy, files={"a.txt": "a\n"})
    source = tmp_path / "atk.c"
    source.write_text(source_text)
    built = subprocess.run([compiler, *defines, "-O1", "-pthread", "-o", str(repo / "atk"),
                            str(source)], capture_output=True, text=True, check=False)  # fmt: skip
    assert built.returncode == 0, built.stderr
    git(repo, "add", "atk")
    git(repo, "commit", "-qm", "atk")
    return repo


def _run(repo: Path, timeout: int = 300):  # type: ignore[no-untyped-def]
    return run_json(repo, "sh", "-c", "mkdir -p /tmp/w && cp ./atk /tmp/atk && /tmp/atk",
                    extra=["--timeout", str(timeout)], timeout=timeout + 100)  # fmt: skip


def _all_refused(repo: Path, data: dict, argv: list[str]) -> list[dict]:  # type: ignore[type-arg]
    ran = processes(predicate(repo, data["commit"]), argv)
    assert ran, "the flip never landed: nothing was tested"
    assert all(p["decision"] == "deny" for p in ran), ran
    return ran


# The attack program: `atk` (no argument) forks ATTEMPTS processes; each sets the inotify
# watch, starts a CLONE_VM child (no CLONE_VFORK, not a thread) that waits for the
# supervisor's read and flips `good` to `evil`, and execs /tmp/atk (its own program file)
# with `atk good`, from its first thread or (THREAD_EXEC) from a second one. `atk evil`
# creates /tmp/w/evil-ran itself or (VIA_CHILD) through a child. CLONE_VM_SIBLING: the
# CLONE_VM child stays alive a second after the flip (the exec's old address space stays in
# use).
# VIA_ORPHAN: its child waits for it to end (killed at its exit_group), then
# creates the file as an orphan. VIA_DEEP: the file is created DEPTH generations below it.
# SWEEP: its first thread ends (SYS_exit) and a second makes the call 0.4 s later, while the
# launcher keeps SLEEPERS `sleep` processes waiting for their checks and makes an allowed
# exec meanwhile.
ATK = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* The flip is timed, not raced: the supervisor reads the program file (its `#!` line) after
   it has read the argv and before it answers; the kernel copies the argv after the answer and
   reads the file after that. An inotify watch (IN_ACCESS) on the program file tells the
   sandbox when the supervisor has read it: then the argument is flipped to `evil`. */
static char word[8] __attribute__((aligned(8))) = "good";
static char stack[65536] __attribute__((aligned(16)));
static int watch = -1;

static int flipper(void *unused) {
    char buf[256];
    syscall(SYS_read, watch, buf, sizeof buf);
    __atomic_store_n((unsigned *)word, *(unsigned *)"evil", __ATOMIC_SEQ_CST);
#ifdef CLONE_VM_SIBLING
    struct timespec ts = {1, 0};  /* the old address space stays in use a while */
    syscall(SYS_nanosleep, &ts, 0);
#endif
    syscall(SYS_exit, 0);
    return 0;
}

static void *execer(void *unused) {
    char *argv[] = {"atk", word, 0};
    execv("/tmp/atk", argv);
    _exit(3);
    return unused;
}

#ifdef SWEEP
static void *late_call(void *unused) {
    usleep(400000);
    syscall(SYS_exit_group, open("/tmp/w/evil-ran", O_WRONLY | O_CREAT, 0644) >= 0 ? 0 : 1);
    return unused;
}
#endif

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "evil") == 0) {
#ifdef NODUMP
        prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
#endif
#ifdef SWEEP
        /* its first thread ends (a zombie leader: /proc/PID/exe reads as nothing), another
           makes the call once the supervisor has swept the checks (at an exec made
           while 256 checks wait) */
        pthread_t w;
        pthread_create(&w, 0, late_call, 0);
        syscall(SYS_exit, 0);
#endif
#ifdef VIA_ORPHAN
        /* a child waits for the refused program to be killed (at its exit_group, its first
           watched call), then makes its call as an orphan */
        pid_t parent = getpid();
        if (fork() == 0) {
            while (getppid() == parent)
                usleep(1000);
            _exit(open("/tmp/w/evil-ran", O_WRONLY | O_CREAT, 0644) >= 0 ? 0 : 1);
        }
        _exit(0);
#endif
#ifdef VIA_DEEP
        /* the call is made DEPTH generations below the refused program */
        for (int d = 0; d < DEPTH; d++) {
            pid_t c = fork();
            if (c != 0) {
                waitpid(c, 0, 0);
                syscall(SYS_exit, 0);  /* not exit_group: no watched call on the way back */
            }
        }
        _exit(open("/tmp/w/evil-ran", O_WRONLY | O_CREAT, 0644) >= 0 ? 0 : 1);
#endif
#ifdef VIA_CHILD
        pid_t p = fork();
        if (p == 0)
            _exit(open("/tmp/w/evil-ran", O_WRONLY | O_CREAT, 0644) >= 0 ? 0 : 1);
        waitpid(p, 0, 0);
        _exit(0);
#else
        _exit(open("/tmp/w/evil-ran", O_WRONLY | O_CREAT, 0644) >= 0 ? 0 : 1);
#endif
    }
    if (argc > 1)
        _exit(0);
#ifndef SLEEPERS
#define SLEEPERS 300
#endif
#ifdef SWEEP
    /* SLEEPERS (300) processes whose allowed exec waits for a check (sleep makes no watched call) */
    pid_t sleepers[300] = {0};
    for (int k = 0; k < SLEEPERS; k++)
        if ((sleepers[k] = fork()) == 0) {
            execl("/bin/sleep", "sleep", "120", (char *)0);
            _exit(3);
        }
#endif
    for (int i = 0; i < ATTEMPTS; i++) {
        pid_t a = fork();
        if (a == 0) {
            watch = inotify_init1(IN_CLOEXEC);
            inotify_add_watch(watch, "/tmp/atk", IN_ACCESS);
            clone(flipper, stack + sizeof stack, CLONE_VM | SIGCHLD, 0);
#ifdef THREAD_EXEC
            pthread_t t;
            pthread_create(&t, 0, execer, 0);
            pause();
#else
            execer(0);
#endif
            _exit(3);
        }
#ifdef SWEEP
        usleep(150000);
        pid_t t = fork();  /* an allowed exec: the supervisor sweeps the checks */
        if (t == 0) {
            execl("/bin/true", "true", (char *)0);
            _exit(3);
        }
        waitpid(t, 0, 0);
#endif
        waitpid(a, 0, 0);
        usleep(2000);
#if defined(VIA_ORPHAN) || defined(VIA_DEEP)
        usleep(50000);
#endif
        if (access("/tmp/w/evil-ran", F_OK) == 0) {
            usleep(300000);
            fprintf(stderr, "evil ran (attempt %d)\n", i);
#ifdef SWEEP
            for (int k = 0; k < SLEEPERS; k++) kill(sleepers[k], 9);
#endif
            return 0;
        }
    }
#ifdef SWEEP
    for (int k = 0; k < SLEEPERS; k++) kill(sleepers[k], 9);
#endif
    fprintf(stderr, "evil never ran\n");
    return 0;
}
"""


@pytest.mark.parametrize("defines", [[], ["-DTHREAD_EXEC"], ["-DVIA_CHILD"], ["-DNODUMP"]],
                         ids=["leader", "thread", "child", "nodump"])  # fmt: skip
def test_a_timed_flip_is_caught(tmp_path: Path, key: Path, defines: list[str]) -> None:
    """Control: the flip lands at nearly every attempt, and every one is caught (killed at
    its first watched call, recorded as refused)."""
    repo = _build(tmp_path, ATK_POLICY, ATK, [*defines, "-DATTEMPTS=150"])
    proc, data = _run(repo)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "evil never ran" in proc.stderr, proc.stderr[-2000:]
    ran = _all_refused(repo, data, ["atk", "evil"])
    # The flip landed in many of the 150 attempts (a refusal repeated is one entry, counted)
    assert sum(p.get("count") or 1 for p in ran) >= 20, ran


@pytest.mark.parametrize("defines", [["-DVIA_CHILD"], ["-DTHREAD_EXEC"]],
                         ids=["child", "thread"])  # fmt: skip
def test_a_clone_vm_child_keeping_the_old_address_space_does_not_hide_the_exec(
    tmp_path: Path, key: Path, defines: list[str]
) -> None:
    """A CLONE_VM child (not vfork, not a thread) keeps the exec's old address space in use
    after the exec of the same program file: the exec is through once the process no longer
    shares it with that child (kcmp), and then the calls of the refused program's children,
    or all of its own when a second thread made the exec, are checked."""
    repo = _build(tmp_path, ATK_POLICY, ATK, [*defines, "-DCLONE_VM_SIBLING", "-DATTEMPTS=150"])
    proc, data = _run(repo)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "evil never ran" in proc.stderr, proc.stderr[-2000:]
    _all_refused(repo, data, ["atk", "evil"])


# The same with an interpreter: `python3 good` (allowed) flipped to `python3 evil` (refused)
# once the supervisor has read python's file; the script `evil` creates /tmp/w/pwned.
PY_FLIP = r"""
import ctypes, os, sys, threading
os.makedirs('/tmp/w', exist_ok=True); os.chdir('/tmp/w')
open('good', 'w').write('pass\n')
open('evil', 'w').write("open('/tmp/w/pwned', 'w').write('x')\n")
libc = ctypes.CDLL(None, use_errno=True)
program = os.readlink('/proc/self/exe').encode()
for i in range(ATTEMPTS):
    pid = os.fork()
    if pid == 0:
        word = ctypes.create_string_buffer(b'good', 8)
        watch = libc.inotify_init1(os.O_CLOEXEC)
        libc.inotify_add_watch(watch, program, 1)  # IN_ACCESS: the supervisor read the file
        def flip():
            os.read(watch, 256)
            ctypes.memmove(word, b'evil', 4)
        threading.Thread(target=flip, daemon=True).start()
        argv = (ctypes.c_char_p * 3)(b'python3', ctypes.cast(word, ctypes.c_char_p), None)
        libc.execv(program, argv)
        os._exit(3)
    os.waitpid(pid, 0)
    if os.path.exists('/tmp/w/pwned'):
        break
print('pwned' if os.path.exists('/tmp/w/pwned') else 'not pwned', i, file=sys.stderr)
"""


def test_a_timed_flip_to_a_refused_script_is_caught(tmp_path: Path, key: Path) -> None:
    repo = make_repo(tmp_path / "repo", policy="commands: {deny: ['python3 evil'], default: allow}\n",
                     files={"a.txt": "a\n"})  # fmt: skip
    program = f"ATTEMPTS = 150\n{PY_FLIP}"
    proc, data = run_json(repo, "python3", "-c", program, timeout=400)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "not pwned" in proc.stderr, proc.stderr[-2000:]
    _all_refused(repo, data, ["python3", "evil"])


# A real refused command (`rm -rf`), exec'd as `rm -ff /tmp/w/d` (allowed; rm refuses a
# folder) and flipped to `rm -rf` once the supervisor has read rm's file, from a second
# thread while a CLONE_VM child keeps the old address space: rm is another program file than
# the caller's, so the check is made (control).
RM_RF = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* A real program the policy refuses (`rm -rf`), run unchecked: a non-leader thread execs
   `rm -ff DIR` (allowed), flipped to `rm -rf DIR` once the supervisor has read rm's file
   (inotify IN_ACCESS), while a CLONE_VM child keeps the old address space in use. */
static char word[8] __attribute__((aligned(8))) = "-ff";
static char stack[65536] __attribute__((aligned(16)));
static int watch = -1;

static int flipper(void *unused) {
    char buf[256];
    syscall(SYS_read, watch, buf, sizeof buf);
    word[1] = 'r';
    struct timespec ts = {2, 0};
    syscall(SYS_nanosleep, &ts, 0);
    syscall(SYS_exit, 0);
    return 0;
}

static void *execer(void *unused) {
    char *argv[] = {"rm", word, "/tmp/w/d", 0};
    execv(RM, argv);
    _exit(3);
    return unused;
}

int main(void) {
    for (int i = 0; i < ATTEMPTS; i++) {
        mkdir("/tmp/w/d", 0755);
        close(creat("/tmp/w/d/f", 0644));
        word[1] = 'f';
        pid_t a = fork();
        if (a == 0) {
            watch = inotify_init1(IN_CLOEXEC);
            inotify_add_watch(watch, RM, IN_ACCESS);
            clone(flipper, stack + sizeof stack, CLONE_VM | SIGCHLD, 0);
#ifdef THREAD_EXEC
            pthread_t t;
            pthread_create(&t, 0, execer, 0);
            pause();
#else
            execer(0);
#endif
            _exit(3);
        }
        waitpid(a, 0, 0);
        if (access("/tmp/w/d", F_OK) != 0) {
            fprintf(stderr, "rm -rf ran (attempt %d)\n", i);
            return 0;
        }
    }
    fprintf(stderr, "rm -rf never ran\n");
    return 0;
}
"""


@pytest.mark.parametrize("defines", [[], ["-DTHREAD_EXEC"]], ids=["leader", "thread"])
def test_rm_rf_flipped_from_an_allowed_rm_is_caught(
    tmp_path: Path, key: Path, defines: list[str]
) -> None:
    rm = shutil.which("rm") or "/bin/rm"
    repo = _build(
        tmp_path,
        "commands: {deny: ['rm -rf'], default: allow}\n",
        RM_RF,
        [*defines, "-DATTEMPTS=150", f'-DRM="{Path(rm).resolve()}"'],
    )
    proc, data = _run(repo)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "rm -rf never ran" in proc.stderr, proc.stderr[-2000:]
    _all_refused(repo, data, ["rm", "-rf"])


def test_a_child_started_by_the_refused_program_is_killed_with_it(
    tmp_path: Path, key: Path
) -> None:
    """The refused program, found at its exit, is killed with the processes it started: its
    child, waiting to be orphaned, never makes its call."""
    repo = _build(tmp_path, ATK_POLICY, ATK, ["-DVIA_ORPHAN", "-DATTEMPTS=150"])
    proc, data = _run(repo)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "evil never ran" in proc.stderr, proc.stderr[-2000:]
    _all_refused(repo, data, ["atk", "evil"])


@pytest.mark.parametrize("depth", [60, 70])
def test_a_call_far_below_the_refused_program_is_still_checked(
    tmp_path: Path, key: Path, depth: int
) -> None:
    """A call made many generations below the refused program still finds it unchecked."""
    repo = _build(tmp_path, ATK_POLICY, ATK, ["-DVIA_DEEP", f"-DDEPTH={depth}", "-DATTEMPTS=150"])
    proc, data = _run(repo)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "evil never ran" in proc.stderr, proc.stderr[-2000:]
    _all_refused(repo, data, ["atk", "evil"])


# fexecve (execveat(fd, "", AT_EMPTY_PATH)) of an allowed program's descriptor; once the
# supervisor has read that file (inotify), another thread dup2()s the refused program's
# descriptor onto it. `evilprog` (a copy of the same binary) creates /tmp/w/evil-ran when it
# runs.
FEXECVE_SWAP = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* fexecve of an allowed program file's descriptor; once the supervisor has read that file
   (inotify IN_ACCESS), another thread puts the refused program's file on the descriptor
   (dup2). */
static int watch, fd, evilfd;

static void *swap(void *unused) {
    char buf[256];
    read(watch, buf, sizeof buf);
    dup2(evilfd, fd);
    return unused;
}

int main(int argc, char **argv) {
    char self[256] = {0};
    readlink("/proc/self/exe", self, sizeof self - 1);
    if (strstr(self, "evilprog")) {
        _exit(open("/tmp/w/evil-ran", O_WRONLY | O_CREAT, 0644) >= 0 ? 0 : 1);
    }
    if (argc > 1)
        _exit(0);
    for (int i = 0; i < ATTEMPTS; i++) {
        pid_t a = fork();
        if (a == 0) {
            fd = open("/tmp/w/goodprog", O_RDONLY);   /* not O_CLOEXEC: fexecve of a script needs it open */
            evilfd = open("/tmp/w/evilprog", O_RDONLY);
            watch = inotify_init1(IN_CLOEXEC);
            inotify_add_watch(watch, "/tmp/w/goodprog", IN_ACCESS);
            pthread_t t;
            pthread_create(&t, 0, swap, 0);
            char *args[] = {ARGV0, "x", 0};
            char *env[] = {0};
            fexecve(fd, args, env);
            _exit(3);
        }
        waitpid(a, 0, 0);
        if (access("/tmp/w/evil-ran", F_OK) == 0) {
            fprintf(stderr, "evil ran (attempt %d)\n", i);
            return 0;
        }
    }
    fprintf(stderr, "evil never ran\n");
    return 0;
}
"""


@pytest.mark.parametrize("how", ["fexecve", "proc-fd-path"])
def test_fexecve_with_the_descriptor_swapped_after_the_judgement_is_caught(
    tmp_path: Path, key: Path, how: str
) -> None:
    """fexecve: the program expected after the exec is the file the descriptor held when
    it was judged, so a file put on the descriptor since is found and judged;
    proc-fd-path (execve of "/proc/self/fd/N"): judged again by what runs."""
    source = FEXECVE_SWAP
    if how == "proc-fd-path":
        source = source.replace(
            "fexecve(fd, args, env);",
            "char path[64]; snprintf(path, "
            'sizeof path, "/proc/self/fd/%d", fd); execve(path, args, env);',
        )
    repo = _build(
        tmp_path,
        "commands: {deny: ['evilprog'], default: allow}\n",
        source,
        ["-DATTEMPTS=150", '-DARGV0="goodprog"'],
    )
    proc, data = run_json(repo, "sh", "-c", "mkdir -p /tmp/w && cp ./atk /tmp/w/goodprog && "
                          "cp ./atk /tmp/w/evilprog && cp ./atk /tmp/atk && /tmp/atk",
                          extra=["--timeout", "300"], timeout=400)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "evil never ran" in proc.stderr, proc.stderr[-2000:]
    pred = predicate(repo, data["commit"])
    ran = [p for p in pred["processes"] if (p.get("exe") or "").endswith("/evilprog")]
    assert ran and all(p["decision"] == "deny" for p in ran), ran


@pytest.mark.parametrize("sleepers", [0, 300])
def test_a_sweep_does_not_drop_the_check_of_a_process_whose_first_thread_ended(
    tmp_path: Path, key: Path, sleepers: int
) -> None:
    """With 256 checks waiting, an allowed exec drops those of processes that are gone; a
    process whose first thread has ended while another runs on is not gone, and that
    thread's call is checked. 0 sleepers: nothing is dropped."""
    repo = _build(tmp_path, ATK_POLICY, ATK,
                  ["-DSWEEP", f"-DSLEEPERS={sleepers}", "-DATTEMPTS=100"])  # fmt: skip
    proc, data = _run(repo)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "evil never ran" in proc.stderr, proc.stderr[-2000:]
    _all_refused(repo, data, ["atk", "evil"])


# A vfork child starts a second thread (a raw clone(CLONE_THREAD)), which execs /tmp/atk as
# `atk good`, flipped to `evil` by a thread of the vfork parent once the supervisor has read
# the file; the vfork parent goes on with the old address space for 0.5 s.
VFORK_THREAD = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* A vfork child starts a second thread, which makes the exec: the vfork parent goes on with
   the old address space. */
static char word[8] __attribute__((aligned(8))) = "good";
static char stack[65536] __attribute__((aligned(16)));
static char stack2[65536] __attribute__((aligned(16)));
static int watch = -1;

static void *flip(void *unused) {
    char buf[256];
    read(watch, buf, sizeof buf);
    __atomic_store_n((unsigned *)word, *(unsigned *)"evil", __ATOMIC_SEQ_CST);
    return unused;
}

static int execer(void *unused) {
    char *argv[] = {"atk", word, 0};
    execv("/tmp/atk", argv);
    syscall(SYS_exit_group, 3);
    return 0;
}

static int child(void *unused) {
#ifdef THREAD_EXEC
    clone(execer, stack2 + sizeof stack2,
          CLONE_VM | CLONE_THREAD | CLONE_SIGHAND | CLONE_FS | CLONE_FILES, 0);
    for (;;) syscall(SYS_pause);
#else
    execer(0);
#endif
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "evil") == 0)
        _exit(open("/tmp/w/evil-ran", O_WRONLY | O_CREAT, 0644) >= 0 ? 0 : 1);
    if (argc > 1)
        _exit(0);
    for (int i = 0; i < ATTEMPTS; i++) {
        pid_t a = fork();
        if (a == 0) {
            watch = inotify_init1(IN_CLOEXEC);
            inotify_add_watch(watch, "/tmp/atk", IN_ACCESS);
            pthread_t t;
            pthread_create(&t, 0, flip, 0);
            pid_t c = clone(child, stack + sizeof stack, CLONE_VM | CLONE_VFORK | SIGCHLD, 0);
            usleep(500000);  /* the vfork parent goes on with the old address space a while */
            waitpid(c, 0, 0);
            _exit(0);
        }
        waitpid(a, 0, 0);
        if (access("/tmp/w/evil-ran", F_OK) == 0) {
            fprintf(stderr, "evil ran (attempt %d)\n", i);
            return 0;
        }
    }
    fprintf(stderr, "evil never ran\n");
    return 0;
}
"""


@pytest.mark.parametrize("defines", [[], ["-DTHREAD_EXEC"]], ids=["leader", "thread"])
def test_a_vfork_childs_second_thread_execing_is_still_checked(
    tmp_path: Path, key: Path, defines: list[str]
) -> None:
    """An exec made by a second thread of a vfork child: the parent that shares its address
    space is found from the thread's own status, and the new program's calls are checked
    once the exec is through. leader: the exec made by the child's first thread."""
    repo = _build(tmp_path, ATK_POLICY, VFORK_THREAD, [*defines, "-DATTEMPTS=150"])
    proc, data = _run(repo)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "evil never ran" in proc.stderr, proc.stderr[-2000:]
    _all_refused(repo, data, ["atk", "evil"])


# A chain of execs, each made by a second thread while the first waits (pause): the first
# thread ends (a zombie) and the exec's thread takes over the process's id. For a moment
# then, the process's pidfd reads as ready, as if the process had ended.
THREAD_EXEC_CHAIN = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char *self;
static int left;

static void *next(void *unused) {
    char count[16];
    snprintf(count, sizeof count, "%d", left - 1);
    char *argv[] = {self, count, 0};
    execv(self, argv);
    _exit(3);
    return unused;
}

int main(int argc, char **argv) {
    self = argv[0];
    left = atoi(argv[1]);
    if (left <= 0)
        return 7;
    pthread_t t;
    pthread_create(&t, 0, next, 0);
    pause();
    return 3;
}
"""


def test_a_process_whose_threads_exec_in_turn_is_watched_to_its_end(
    tmp_path: Path, key: Path
) -> None:
    """Each exec of the chain is made by a second thread: the process's pidfd reads as ready
    for a moment at some of them, while the process goes on. It is not taken for ended
    (which would drop the check of what its exec runs, and its record): every exec is
    checked, and the chain's last program's exit code is recorded."""
    repo = _build(tmp_path, ATK_POLICY, THREAD_EXEC_CHAIN, [])
    execs = 3000
    proc, data = run_json(repo, "sh", "-c", f"cp ./atk /tmp/atk && exec /tmp/atk {execs}",
                          extra=["--timeout", "300"], timeout=400)  # fmt: skip
    assert proc.returncode == 7, proc.stderr[-2000:]  # the agent's exit code
    assert data["exit_code"] == 7, data
    ran = processes(predicate(repo, data["commit"]), ["/tmp/atk"])
    assert len(ran) == execs + 1, len(ran)
    assert [p for p in ran if p["killed"] or p["signal"] is not None] == []
    # One process all along: each exec is replaced by the next, and the last one exits 7.
    assert len({p["pid"] for p in ran}) == 1
    assert ran[-1]["exit_code"] == 7, ran[-1]


# Loaded (LD_PRELOAD) into an allowed `rm -f /tmp/w/none`: a second thread execs the real rm,
# with no preload, as `rm -ff /tmp/w/d` (allowed; rm refuses a folder), flipped to `-rf`
# once the supervisor has read rm's file. The flip is made, and the old address space then
# held for 3 s, by CLONE_VM processes the supervisor cannot find: started by a CLONE_VM
# child that ends at once (orphans, no children of the process), or (CHILD) as a child.
PRELOAD_HOOK = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/inotify.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static char flag[8] __attribute__((aligned(8))) = "-ff";
static char stacks[3][65536] __attribute__((aligned(16)));
static int watch = -1;

static int hold(void *unused) {
    struct timespec ts = {3, 0};
    syscall(SYS_nanosleep, &ts, 0);
    syscall(SYS_exit, 0);
    return 0;
}

static int flip(void *unused) {
    char buf[256];
    clone(hold, stacks[2] + sizeof stacks[2], CLONE_VM | SIGCHLD, 0);
    syscall(SYS_read, watch, buf, sizeof buf);
    flag[1] = 'r';
    syscall(SYS_exit, 0);
    return 0;
}

static int starter(void *unused) {
    clone(flip, stacks[1] + sizeof stacks[1], CLONE_VM | SIGCHLD, 0);
    syscall(SYS_exit, 0);
    return 0;
}

static void *execer(void *unused) {
    char *argv[] = {"rm", flag, "/tmp/w/d", 0};
    char *envp[] = {"PATH=/usr/bin:/bin", 0};
    execve(RM, argv, envp);
    syscall(SYS_exit_group, 3);
    return unused;
}

__attribute__((constructor)) static void go(void) {
    if (!getenv("HOOK_GO"))
        return;
    watch = inotify_init1(IN_CLOEXEC);
    inotify_add_watch(watch, RM, IN_ACCESS);
#ifdef CHILD
    clone(flip, stacks[1] + sizeof stacks[1], CLONE_VM | SIGCHLD, 0);
#else
    waitpid(clone(starter, stacks[0] + sizeof stacks[0], CLONE_VM | SIGCHLD, 0), 0, 0);
#endif
    pthread_t t;
    pthread_create(&t, 0, execer, 0);
    for (;;)
        pause();
}
"""

PRELOAD_DRIVER = r"""
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
    int gone = 0;
    for (int i = 0; i < ATTEMPTS; i++) {
        mkdir("/tmp/w/d", 0755);
        close(creat("/tmp/w/d/f", 0644));
        pid_t a = fork();
        if (a == 0) {
            char *argv[] = {"rm", "-f", "/tmp/w/none", 0};
            char *envp[] = {"LD_PRELOAD=/tmp/w/hook.so", "HOOK_GO=1", "PATH=/usr/bin:/bin", 0};
            execve(RM, argv, envp);
            _exit(3);
        }
        waitpid(a, 0, 0);
        usleep(20000);
        if (access("/tmp/w/d", F_OK) != 0)
            gone++;
    }
    fprintf(stderr, "rm -rf ran %d times\n", gone);
    return 0;
}
"""


@pytest.mark.parametrize("holder", ["orphan", "child"])
def test_a_real_rm_flipped_while_unknown_processes_hold_the_old_address_space_is_caught(
    tmp_path: Path, key: Path, holder: str
) -> None:
    """The real rm (no agent code in it) exec'd by a second thread of a program that runs
    agent code, flipped to a refused `rm -rf`, while processes the supervisor does not know
    of keep the old address space in use: the exec is seen through by its thread (which has
    taken the process's id) and by the new layout of the address space, not by the old one
    being unused, and every landed flip is refused and killed."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    rm = Path(shutil.which("rm") or "/bin/rm").resolve()
    defines = [f'-DRM="{rm}"', "-DATTEMPTS=20", *(["-DCHILD"] if holder == "child" else [])]
    repo = _build(tmp_path, "commands: {deny: ['rm -rf'], default: allow}\n", PRELOAD_DRIVER,
                  defines)  # fmt: skip
    (tmp_path / "hook.c").write_text(PRELOAD_HOOK)
    built = subprocess.run([compiler, *defines, "-O1", "-shared", "-fPIC", "-pthread", "-o",
                            str(repo / "hook.so"), str(tmp_path / "hook.c")],
                           capture_output=True, text=True, check=False)  # fmt: skip
    assert built.returncode == 0, built.stderr
    git(repo, "add", "hook.so")
    git(repo, "commit", "-qm", "hook")
    proc, data = run_json(repo, "sh", "-c", "mkdir -p /tmp/w && cp ./hook.so /tmp/w/hook.so && "
                          "cp ./atk /tmp/atk && /tmp/atk 2>&1 | grep -v 'Is a directory' >&2",
                          extra=["--timeout", "300"], timeout=400)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "rm -rf ran 0 times" in proc.stderr, proc.stderr[-2000:]
    refused = _all_refused(repo, data, ["rm", "-rf"])
    assert sum(p.get("count") or 1 for p in refused) >= 5, refused  # the flip landed


def test_a_process_ended_before_its_exec_was_checked_says_so(tmp_path: Path, key: Path) -> None:
    """A program killed before any watched call (none showed what its exec ran; this one,
    built without a C library, makes no call at all): its record says what was judged, and
    that it was never checked against what ran. A program built with one is checked at its
    first call, as its C library sets it up."""
    repo = _build(tmp_path, "commands: {default: allow}\n", "void _start(void) { for (;;); }\n",
                  ["-nostdlib", "-static"])  # fmt: skip
    proc, data = run_json(repo, "sh", "-c", "./atk & sleep 0.5; kill -9 $!; wait; "
                          "sleep 30 & sleep 0.5; kill -9 $!; wait; true")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    spun = processes(predicate(repo, data["commit"]), ["./atk"])
    assert len(spun) == 1 and spun[0]["signal"] == 9, spun
    assert "ended before what it ran could be checked" in spun[0]["rule"], spun
    slept = processes(predicate(repo, data["commit"]), ["sleep", "30"])
    assert len(slept) == 1 and slept[0]["signal"] == 9, slept
    assert "checked" not in (slept[0]["rule"] or ""), slept


# Programs that write into their own arguments once they run, as many do: npm and node's
# process.title (libuv writes the title over them), setproctitle, and coreutils' mkdir -p,
# which puts a NUL at each / of its path while it makes each folder. This one writes a
# title over its own, then creates a file.
RENAMING = r"""
#include <fcntl.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
    size_t room = strlen(argv[0]) + 1 + strlen(argv[1]);
    memset(argv[0], 0, room);
    memcpy(argv[0], "worker", 6);
    int fd = open("renamed.txt", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    return fd >= 0 && write(fd, "done", 4) == 4 ? 0 : 1;
}
"""


def test_programs_that_rename_themselves_are_listed_as_they_were_run(
    tmp_path: Path, key: Path
) -> None:
    """What a program writes over its own arguments once it runs is not what the kernel
    was asked to run: it is checked at its C library's first call, before any of its own
    code, so the receipt lists the command line as run and judged, and a policy that allows
    only that command line does not end the program when it renames itself."""
    policy = ("commands: {default: deny, allow: ['sh', 'mkdir -p', 'atk renamed']}\n"
              "paths: {write: ['**']}\n")  # fmt: skip
    repo = _build(tmp_path, policy, RENAMING, [])
    proc, data = run_json(repo, "sh", "-c", "mkdir -p d/e/f && ./atk renamed")
    assert proc.returncode == 0, proc.stderr[-2000:]
    pred = predicate(repo, data["commit"])
    made = processes(pred, ["mkdir", "-p"])
    assert [p["argv"] for p in made] == [["mkdir", "-p", "d/e/f"]], made
    renamed = processes(pred, ["./atk"])
    assert [p["argv"] for p in renamed] == [["./atk", "renamed"]], renamed
    for p in made + renamed:
        assert p["decision"] == "allow" and "differs" not in (p["rule"] or ""), p
        assert p["exit_code"] == 0, p
    shown = subprocess.run(["git", "-C", str(repo), "show", f"{data['commit']}:renamed.txt"],
                           capture_output=True, text=True, check=False)  # fmt: skip
    assert shown.stdout == "done", shown.stderr


PR_SET_MM = r"""
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
out = {}
# PR_SET_MM_MAP_SIZE (14), PR_SET_MM_ARG_START (8): refused whatever the option
for name, option in (("map_size", 14), ("arg_start", 8)):
    size = ctypes.c_uint(0)
    got = libc.prctl(35, option, ctypes.byref(size) if option == 14 else 0, 0, 0)
    out[name] = ctypes.get_errno() if got < 0 else "done"
libc.prctl(15, b"renamed", 0, 0, 0)  # PR_SET_NAME: other options work
out["name"] = open("/proc/self/comm").read().strip()
with open("mm.json", "w") as fh:
    json.dump(out, fh)
"""


def test_no_layout_of_an_address_space_is_rewritten_inside(tmp_path: Path, key: Path) -> None:
    """prctl(PR_SET_MM) (PR_SET_MM_MAP needs no capability) would let the old program make
    its address space look replaced while its thread's exec is under way: the sandbox's
    filter refuses it (EPERM); other prctl options work."""
    repo = make_repo(tmp_path / "repo", policy="paths: {write: ['**']}\n")
    proc, data = run_json(repo, "python3", "-c", PR_SET_MM)
    assert proc.returncode == 0, proc.stderr
    shown = subprocess.run(["git", "-C", str(repo), "show", f"{data['commit']}:mm.json"],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert json.loads(shown) == {"map_size": 1, "arg_start": 1, "name": "renamed"}


PERSONALITY = r"""
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
libc.personality.argtypes = [ctypes.c_ulong]
out = {"start": open("/proc/self/personality").read().strip()}
got = libc.personality(0x0040000)  # ADDR_NO_RANDOMIZE: refused
out["no_randomize"] = ctypes.get_errno() if got < 0 else "done"
got = libc.personality(0x0400000)  # READ_IMPLIES_EXEC: other personas work
out["read_implies_exec"] = ctypes.get_errno() if got < 0 else "done"
out["now"] = libc.personality(0xFFFFFFFF)
with open("persona.json", "w") as fh:
    json.dump(out, fh)
"""


@pytest.mark.parametrize("setarch", [False, True], ids=["plain", "launcher-under-setarch-R"])
def test_address_randomization_cannot_be_turned_off_inside(
    tmp_path: Path, key: Path, setarch: bool
) -> None:
    """personality(ADDR_NO_RANDOMIZE) would lay the same program out alike at every exec, and
    the supervisor tells an exec's new address space from the old one by its layout: the
    sandbox's filter refuses it (EPERM), other personas work, and a launcher started under
    `setarch -R` hands the sandbox address randomization on all the same."""
    if setarch and shutil.which("setarch") is None:
        pytest.skip("no setarch")
    repo = make_repo(tmp_path / "repo", policy="paths: {write: ['**']}\n")
    args = ["run", "--repo", str(repo), "--json", "--", "python3", "-c", PERSONALITY]
    command = [sys.executable, "-m", "gatekeeper", *args]
    if setarch:
        command = ["setarch", "-R", *command]
        outside = subprocess.run(["setarch", "-R", "cat", "/proc/self/personality"],
                                 capture_output=True, text=True, check=True)  # fmt: skip
        assert int(outside.stdout, 16) & 0x0040000  # the launcher's own is off
    proc = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    shown = subprocess.run(["git", "-C", str(repo), "show", f"{data['commit']}:persona.json"],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert json.loads(shown) == {"start": "00000000", "no_randomize": 1,
                                 "read_implies_exec": "done", "now": 0x0400000}  # fmt: skip


# A static program with no libc (its new program makes no watched call unless it wants to)
# turns address randomization off, then forks ATTEMPTS processes; each sets an inotify watch
# on its program file, starts a CLONE_VM child that waits for the supervisor's read of the
# file, flips `good` to `evil` and keeps the old address space in use for a while, and execs
# /tmp/atk `good` from a second thread. `atk evil`, laid out exactly as the old program (the
# same file, arguments and environment as long, no randomization), makes no watched call from
# its first thread: a child of it creates /tmp/w/evil-ran.
THREAD_SAME_LAYOUT = r"""
typedef unsigned long u64;
static long sc(long n, long a, long b, long c, long d) {
    long ret;
    register long r10 asm("r10") = d;
    asm volatile("syscall" : "=a"(ret) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10)
                 : "rcx", "r11", "memory");
    return ret;
}
#define S(n, a, b, c) sc(n, (long)(a), (long)(b), (long)(c), 0)
enum { READ = 0, WRITE = 1, OPEN = 2, NANOSLEEP = 35, FORK = 57, EXECVE = 59, EXIT = 60,
       WAIT4 = 61, ACCESS = 21, PERSONALITY = 135, INOTIFY_ADD = 254, INOTIFY_INIT1 = 294 };
long raw_clone(u64 flags, void *stack, int (*fn)(void *), void *arg);
asm(".text\n.globl raw_clone\nraw_clone:\n"
    "mov %rdx,%r8\nmov %rcx,%r9\nmov $56,%eax\nxor %edx,%edx\nxor %r10d,%r10d\nsyscall\n"
    "test %rax,%rax\njnz 1f\nmov %r9,%rdi\ncall *%r8\nmov %eax,%edi\nmov $60,%eax\nsyscall\n"
    "1: ret\n");
asm(".text\n.globl _start\n_start:\nxor %ebp,%ebp\nmov %rsp,%rdi\nand $-16,%rsp\n"
    "call cstart\nhlt\n");
static int same(const char *a, const char *b) { while (*a && *a == *b) a++, b++; return *a == *b; }
static void say(const char *s) { u64 n = 0; while (s[n]) n++; S(WRITE, 2, s, n); }
static char word[8] __attribute__((aligned(8))) = "good";
static char stack_f[65536] __attribute__((aligned(16)));
static char stack_t[65536] __attribute__((aligned(16)));
static int watch = -1;
static char **envp;
static void nap(long sec, long nsec) { long ts[2] = {sec, nsec}; S(NANOSLEEP, ts, 0, 0); }

static int flipper(void *unused) {
    char buf[256];
    S(READ, watch, buf, sizeof buf);
    __atomic_store_n((unsigned *)word, *(unsigned *)"evil", __ATOMIC_SEQ_CST);
    nap(2, 0);  /* the exec's old address space stays in use */
    S(EXIT, 0, 0, 0);
    return 0;
}
static int execer(void *unused) {
    char *argv[] = {"atk", word, 0};
    S(EXECVE, "/tmp/atk", argv, envp);
    S(EXIT, 3, 0, 0);
    return 0;
}
void cstart(long *sp) {
    long argc = sp[0];
    char **argv = (char **)(sp + 1);
    envp = argv + argc + 1;
    if (argc > 1 && same(argv[1], "evil")) {
        long child = S(FORK, 0, 0, 0);
        if (child == 0) S(EXIT, S(OPEN, "/tmp/w/evil-ran", 0101, 0644) >= 0 ? 0 : 1, 0, 0);
        sc(WAIT4, child, 0, 0, 0);
        nap(0, 300000000);
        S(EXIT, 0, 0, 0);  /* SYS_exit: no watched call */
    }
    if (argc > 1 && same(argv[1], "good")) S(EXIT, 0, 0, 0);
    if (argc == 1) {
        S(PERSONALITY, 0x0040000, 0, 0);  /* ADDR_NO_RANDOMIZE, for the next exec */
        char *again[] = {"atk", "prep", 0};
        S(EXECVE, "/tmp/atk", again, envp);
        S(EXIT, 3, 0, 0);
    }
    for (int i = 0; i < ATTEMPTS; i++) {
        long attempt = S(FORK, 0, 0, 0);
        if (attempt == 0) {
            watch = S(INOTIFY_INIT1, 02000000, 0, 0);
            S(INOTIFY_ADD, watch, "/tmp/atk", 1);  /* IN_ACCESS */
            raw_clone(0x100 | 17, stack_f + sizeof stack_f, flipper, 0);  /* CLONE_VM */
            /* CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD */
            raw_clone(0x100 | 0x200 | 0x400 | 0x800 | 0x10000, stack_t + sizeof stack_t,
                      execer, 0);
            for (;;) S(34, 0, 0, 0);  /* pause */
        }
        sc(WAIT4, attempt, 0, 0, 0);
        nap(0, 50000000);
        if (S(ACCESS, "/tmp/w/evil-ran", 0, 0) == 0) {
            say("evil ran\n");
            S(EXIT, 0, 0, 0);
        }
    }
    say("evil never ran\n");
    S(EXIT, 0, 0, 0);
}
"""


def test_a_threads_exec_laid_out_as_the_old_program_is_checked(tmp_path: Path, key: Path) -> None:
    """A second thread's exec is through, for a call of another process, once the layout of
    the process's address space differs from the old one's. The same static program run
    again with address randomization off, arguments and environment as long, would be laid
    out exactly alike: the exec would look under way for as long as a CLONE_VM child kept
    the old address space, and a child of the new program (`atk evil`, refused by the
    policy, its first thread making no watched call) would act unchecked. The sandbox does
    not let randomization be turned off: every landed flip is refused."""
    if platform.machine() != "x86_64":
        pytest.skip("the attack program is written for x86_64")
    flags = ["-static", "-nostdlib", "-fno-stack-protector", "-no-pie", "-DATTEMPTS=20"]
    repo = _build(tmp_path, ATK_POLICY, THREAD_SAME_LAYOUT, flags)
    proc, data = _run(repo)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "evil never ran" in proc.stderr, proc.stderr[-2000:]
    _all_refused(repo, data, ["atk", "evil"])


# P (`atk good`, no address randomisation) execs /tmp/atk `good`, flipped to `evil` once the
# supervisor has read the file; P's robust futex list, on pages that fault behind two CLONE_VM
# forkers holding the address space's lock, keeps its exec in the old address space for a
# while. S, P's first CLONE_VM child (the sharer the supervisor records), execs /tmp/atk
# `good` itself just after: the same file, arguments and environment as long, so its new
# address space is laid out exactly as the old one.
SHARER_SAME_LAYOUT = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#define SPACE (128 * 1024)
#define ENTRIES 2000
#define AREAS 20000
extern char **environ;
static char *word, *listing, stacks[2][65536] __attribute__((aligned(16)));
static int watch = -1;
static time_t until;
static volatile int go;
static char s_atk[] = "atk", s_good[] = "good", s_path[] = "/tmp/atk";

static int forker(void *unused) {
    signal(SIGCHLD, SIG_IGN);
    while (time(0) < until)
        if (fork() == 0) syscall(SYS_exit, 0);
    syscall(SYS_exit, 0);
    return 0;
}

static int flipper(void *unused) {
    char buf[256];
    syscall(SYS_read, watch, buf, sizeof buf);
    __atomic_store_n((unsigned *)word, *(unsigned *)"evil", __ATOMIC_SEQ_CST);
    syscall(SYS_exit, 0);
    return 0;
}

static int sharer(void *unused) {
    while (!__atomic_load_n(&go, __ATOMIC_SEQ_CST)) syscall(SYS_sched_yield);
    struct timespec pause = {0, 3000000};
    syscall(SYS_nanosleep, &pause, 0);
    syscall(SYS_close, 100);
    syscall(SYS_dup2, 1, 101);
    char *av[] = {s_atk, s_good, 0};
    syscall(SYS_execve, s_path, av, environ);
    syscall(SYS_exit, 3);
    return 0;
}

static char *shared_pages(size_t size) {
    char *p = mmap(0, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    memset(p, 0, size);
    return p;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "evil"))
        syscall(SYS_exit_group, open("/tmp/w/evil-ran", O_WRONLY | O_CREAT, 0644) >= 0 ? 9 : 1);
    if (fcntl(101, F_GETFD) >= 0) {  /* S after its exec: watched calls for a while */
        time_t stop = time(0) + 4;
        while (time(0) < stop) {
            int fd = open("/tmp/w/spin", O_WRONLY | O_CREAT, 0644);
            if (fd >= 0) close(fd);
        }
        syscall(SYS_exit_group, 0);
    }
    if (fcntl(102, F_GETFD) >= 0) syscall(SYS_exit_group, 5);  /* the flip missed */
    if (fcntl(100, F_GETFD) >= 0) {  /* P */
        fcntl(100, F_SETFD, FD_CLOEXEC);
        until = time(0) + 4;
        char *sharer_stack = shared_pages(65536);  /* (a private one would fault behind a fork) */
        clone(sharer, sharer_stack + 65536, CLONE_VM | SIGCHLD, 0);
        listing = mmap(0, (long)(ENTRIES + 1) * SPACE, PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        char *areas = mmap(0, 4096L * 2 * (AREAS + 1), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        for (int i = 0; i < AREAS; i++) {
            char *p = areas + 4096L * 2 * i;
            mprotect(p, 4096, PROT_READ | PROT_WRITE);
            p[0] = 1;
        }
        watch = inotify_init1(IN_CLOEXEC);
        inotify_add_watch(watch, "/tmp/atk", IN_ACCESS);
        char *flip_stack = shared_pages(65536 + 4096);
        word = flip_stack + 65536;
        strcpy(word, "good");
        clone(flipper, flip_stack + 65536, CLONE_VM | SIGCHLD, 0);
        clone(forker, stacks[0] + 65536, CLONE_VM | SIGCHLD, 0);
        clone(forker, stacks[1] + 65536, CLONE_VM | SIGCHLD, 0);
        usleep(200000);
        struct robust_list_head *head = (void *)listing;
        head->futex_offset = 64;
        head->list_op_pending = 0;
        struct robust_list *prev = &head->list;
        for (int i = 1; i <= ENTRIES; i++) {
            struct robust_list *entry = (void *)(listing + (long)i * SPACE);
            prev->next = entry;
            prev = entry;
        }
        prev->next = &head->list;
        syscall(SYS_set_robust_list, head, sizeof *head);
        madvise(listing, (long)(ENTRIES + 1) * SPACE, MADV_DONTNEED);
        /* the environment's strings on shared pages dropped just before the exec: its copy
           waits behind a fork too */
        char *env = shared_pages(1 << 20), *ep[512];
        int n = 0;
        size_t off = 0;
        for (char **e = environ; *e && n < 511; e++) {
            size_t len = strlen(*e) + 1;
            memcpy(env + off, *e, len);
            ep[n++] = env + off;
            off += len;
        }
        ep[n] = 0;
        char *av[] = {s_atk, word, 0};
        dup2(2, 102);
        __atomic_store_n(&go, 1, __ATOMIC_SEQ_CST);
        madvise(env, 1 << 20, MADV_DONTNEED);
        syscall(SYS_execve, s_path, av, ep);
        _exit(3);
    }
    personality(ADDR_NO_RANDOMIZE);
    int ran = 0;
    for (int i = 0; i < ATTEMPTS; i++) {
        pid_t a = fork();
        if (a == 0) {
            dup2(2, 100);
            char *av[] = {"atk", "good", 0};
            execv("/tmp/atk", av);
            _exit(3);
        }
        waitpid(a, 0, 0);
        sleep(5);
        if (access("/tmp/w/evil-ran", F_OK) == 0) {
            unlink("/tmp/w/evil-ran");
            ran++;
        }
    }
    fprintf(stderr, "evil ran %d of %d\n", ran, ATTEMPTS);
    return 0;
}
"""


def test_a_sharer_execing_the_same_program_laid_out_alike_does_not_end_the_check(
    tmp_path: Path, key: Path
) -> None:
    """A first-thread exec whose old address space a CLONE_VM child shares is known through
    once the child goes on with the old one while the process does not: the child's own exec
    of the same program, laid out exactly alike (no address randomisation, arguments as
    long), would read as the old one while the process's exec is still under way. The check
    would then read the old program's argv (the judged one), be used up, and the refused
    program run unrecorded. A sharer that execs is no longer counted on: every landed flip
    is refused."""
    repo = _build(tmp_path, ATK_POLICY, SHARER_SAME_LAYOUT, ["-DATTEMPTS=8"])
    proc, data = _run(repo)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "evil ran 0 of 8" in proc.stderr, proc.stderr[-2000:]
    _all_refused(repo, data, ["atk", "evil"])


# A second thread's exec of git, let through as `git status`, takes long in the kernel (an
# environment of 600,000 strings is copied before the argv); meanwhile a third thread's exec
# of a file that is no program is let through and fails (ENOEXEC), and the third thread ends;
# then the first thread makes a watched call and changes `status` to `push` in place.
TWO_EXECS = r"""
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
static char word[8] = "status";
static void *slow(void *unused) {
    char *argv[] = {"git", word, 0}, **env = calloc(600001, sizeof(char *));
    for (int i = 0; i < 600000; i++)
        env[i] = "";
    syscall(SYS_execve, GIT, argv, env);
    return unused;
}
static void *failing(void *unused) {
    char *argv[] = {"./junk", 0}, *envp[] = {0};
    usleep(15000);
    syscall(SYS_execve, "./junk", argv, envp);
    return unused;
}
int main(void) {
    struct rlimit stack = {64 << 20, 64 << 20};
    pthread_t a, b;
    setrlimit(RLIMIT_STACK, &stack);
    if (pthread_create(&a, 0, slow, 0) != 0 || pthread_create(&b, 0, failing, 0) != 0)
        return 1;
    pthread_join(b, 0);
    usleep(1000);
    close(open("touched", O_WRONLY | O_CREAT, 0644));
    usleep(5000);
    memcpy(word, "push", 5);
    pause();
    return 0;
}
"""


def test_an_exec_while_another_threads_exec_is_under_way_is_refused(
    tmp_path: Path, key: Path
) -> None:
    """A process has one check after an exec at a time: a thread's exec while another's is let
    through and not yet seen through is refused and recorded, so that the first one's check
    stays (a failed second exec's check would be used up on the old program), and what the
    first one runs, its argv changed after it was judged, is killed and recorded."""
    git_path = Path(shutil.which("git") or "/usr/bin/git").resolve()
    repo = _build(tmp_path, "commands: {deny: ['git push'], default: allow}\n", TWO_EXECS,
                  [f'-DGIT="{git_path}"'])  # fmt: skip
    (repo / "junk").write_text("no program\n")
    (repo / "junk").chmod(0o755)
    git(repo, "add", "junk")
    git(repo, "commit", "-qm", "junk")
    proc, data = run_json(repo, "./atk", extra=["--timeout", "60"])
    assert "No configured push destination" not in proc.stderr, proc.stderr[-2000:]
    pred = predicate(repo, data["commit"])
    pushed = processes(pred, ["git", "push"])
    assert pushed and all(p["decision"] == "deny" for p in pushed), pred["processes"]
    junk = processes(pred, ["./junk"])
    assert [p["rule"] for p in junk] == ["(another thread of this process has an exec under way)"]


@pytest.mark.parametrize("then", ["ends", "sleeps"])
def test_an_exec_after_another_threads_exec_failed_is_let_through(
    tmp_path: Path, key: Path, then: str
) -> None:
    """A thread's exec that failed (a file that is no program), the thread then ended or in
    another call: another thread's exec is let through, and runs."""
    repo = make_repo(tmp_path / "repo", policy="commands: {default: allow}\n",
                     files={"junk": "no program\n"})  # fmt: skip
    (repo / "junk").chmod(0o755)
    git(repo, "commit", "-qam", "junk")
    program = (
        "import os, sys, threading, time\n"
        "def fail():\n"
        "    try:\n"
        "        os.execv('./junk', ['./junk'])\n"
        "    except OSError as exc:\n"
        "        print('junk', exc.errno, file=sys.stderr, flush=True)\n"
        f"    if {then == 'sleeps'}:\n"
        "        time.sleep(30)\n"
        "threading.Thread(target=fail, daemon=True).start()\n"
        "time.sleep(0.5)\n"
        "threading.Thread(target=os.execv, args=('/bin/echo', ['echo', 'ran'])).start()\n"
        "time.sleep(30)\n"
    )
    proc, data = run_json(repo, "python3", "-c", program)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ran" in proc.stderr.split(), proc.stderr[-2000:]
    echoed = processes(predicate(repo, data["commit"]), ["echo", "ran"])
    assert [p["decision"] for p in echoed] == ["allow"], echoed


# The process that shares the exec's address space (a CLONE_VM child here) ends its first
# thread (SYS_exit, not watched) right after the answer, while a second thread of it keeps
# the old address space in use: its stat file then shows no layout (every field 0), and kcmp
# against it says nothing is shared. A child forked before the exec makes a watched call
# while the exec still copies its (long) environment. Were the zeros taken for the old
# layout, that call would find the exec "through", check the old program (`atk good`,
# passes) and drop the check; the exec would then go on to run `atk evil` unchecked.
ZOMBIE_SHARER = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define ENTRIES 400000
static char word[8] __attribute__((aligned(8))) = "good";
static char stack_f[65536] __attribute__((aligned(16)));
static char stack_k[65536] __attribute__((aligned(16)));
static int watch_f = -1, watch_d = -1;
static volatile long spin;

static int keeps_it(void *unused) {  /* F's second thread: the old address space in use */
    struct timespec ts = {3, 0};
    syscall(SYS_nanosleep, &ts, 0);
    syscall(SYS_exit, 0);
    return 0;
}

static int read_at(int watch) {  /* waits for the supervisor's read of the program file */
    char buf[4096];
    for (;;) {
        long n = syscall(SYS_read, watch, buf, sizeof buf);
        if (n <= 0 || ((struct inotify_event *)buf)->mask & IN_ACCESS) return 0;
    }
}

static int sharer(void *unused) {  /* F */
    clone(keeps_it, stack_k + sizeof stack_k,
          CLONE_VM | CLONE_THREAD | CLONE_SIGHAND | CLONE_FS | CLONE_FILES, 0);
    read_at(watch_f);
    __atomic_store_n((unsigned *)word, *(unsigned *)"evil", __ATOMIC_SEQ_CST);
    for (volatile long i = 0; i < spin; i++) ;
    syscall(SYS_exit, 0);  /* the first thread only */
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "evil") == 0)
        _exit(open("/tmp/w/evil-ran", O_WRONLY | O_CREAT, 0644) >= 0 ? 0 : 1);
    if (argc > 2) {  /* `atk good DELAY`: makes the exec */
        if (getenv("ATK_AGAIN")) _exit(0);
        spin = atol(argv[2]);
        struct rlimit big = {64 << 20, 64 << 20};
        setrlimit(RLIMIT_STACK, &big);
        char **env = malloc((ENTRIES + 2) * sizeof *env);
        env[0] = "ATK_AGAIN=1";
        for (int k = 1; k <= ENTRIES; k++) env[k] = "A";
        env[ENTRIES + 1] = 0;
        watch_f = inotify_init1(IN_CLOEXEC);
        inotify_add_watch(watch_f, "/tmp/atk", IN_ACCESS);
        watch_d = inotify_init1(IN_CLOEXEC);
        inotify_add_watch(watch_d, "/tmp/atk", IN_OPEN | IN_ACCESS);
        if (fork() == 0) {  /* D: a watched call while the exec copies the environment */
            char buf[4096];
            read_at(watch_d);
            syscall(SYS_read, watch_d, buf, sizeof buf);  /* the kernel's own open: answered */
            usleep(3000);
            mkdir("/tmp/w/d-call", 0755);
            rmdir("/tmp/w/d-call");
            _exit(0);
        }
        clone(sharer, stack_f + sizeof stack_f, CLONE_VM | SIGCHLD, 0);
        usleep(20000);
        char *again[] = {"atk", word, argv[2], 0};
        execve("/tmp/atk", again, env);
        _exit(3);
    }
    for (int i = 0; i < ATTEMPTS; i++) {
        char delay[32];
        snprintf(delay, sizeof delay, "%d", (i * 1237) % 300000);
        pid_t pid = fork();
        if (pid == 0) {
            execl("/tmp/atk", "atk", "good", delay, (char *)0);
            _exit(3);
        }
        waitpid(pid, 0, 0);
        usleep(100000);
        if (access("/tmp/w/evil-ran", F_OK) == 0) {
            fprintf(stderr, "evil ran (attempt %d)\n", i);
            return 0;
        }
    }
    fprintf(stderr, "evil never ran\n");
    return 0;
}
"""


def test_a_sharer_whose_first_thread_ended_does_not_pass_the_exec_as_through(
    tmp_path: Path, key: Path
) -> None:
    """The layout of the address space an exec starts from, read through the process that
    shares it once the exec is answered, is no layout when that process's first thread has
    ended: the check then waits for the exec's own thread, and `atk evil` is caught."""
    repo = _build(tmp_path, ATK_POLICY, ZOMBIE_SHARER, ["-DATTEMPTS=120"])
    proc, data = _run(repo)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "evil never ran" in proc.stderr, proc.stderr[-2000:]
    _all_refused(repo, data, ["atk", "evil"])
