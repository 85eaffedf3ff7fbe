"""The command rules as the supervisor applies them at every exec: found by the program they
name, with the same decision (and the same deciding rule) as trying every rule in order."""

from __future__ import annotations

import os
import random
import re
import shlex
from pathlib import Path

from gatekeeper.sandbox.supervise.rules import (
    ALLOW,
    ASK,
    DENY,
    EXTERNAL,
    CommandRules,
    _program_matches,
    rule_matches,
)


def reference_covers(rule: list[str], argv: list[str], exe: str | None) -> bool:
    """The loose match as written out in the policy's documentation, word by word: the rule's
    words in order among the argv's, its short flags a subset of the argv's letters."""
    if not rule or not argv or not _program_matches(rule[0], argv[0], exe):
        return False
    if (
        (rule[0] == "git" or rule[0].endswith("/git"))
        and len(rule) > 1
        and not rule[1].startswith("-")
    ):
        # git's command (`git-NAME`'s NAME, or the first word past git's own options) is the
        # rule's second word; past an option not known, the words alone decide.
        name = os.path.basename(argv[0])
        if name.startswith("git-") and len(name) > 4:
            command: str | None = name[4:]
        else:
            command, words = None, iter(argv[1:])
            for word in words:
                if word in ("-c", "-C", "--git-dir", "--work-tree", "--namespace",
                            "--super-prefix", "--config-env", "--list-cmds", "--attr-source",
                            "--shallow-file"):  # fmt: skip
                    next(words, None)
                elif word.startswith("-") and not (
                    word
                    in (
                        "-p",
                        "-P",
                        "--bare",
                        "--no-pager",
                        "--paginate",
                        "--exec-path",
                        "--literal-pathspecs",
                        "--no-literal-pathspecs",
                        "--glob-pathspecs",
                        "--noglob-pathspecs",
                        "--icase-pathspecs",
                        "--no-replace-objects",
                        "--no-lazy-fetch",
                        "--no-optional-locks",
                        "--no-advice",
                        "--html-path",
                        "--man-path",
                        "--info-path",
                        "-v",
                        "--version",
                        "-h",
                        "--help",
                    )  # fmt: skip
                    or word.split("=", 1)[0] + "="
                    in (
                        "--git-dir=",
                        "--work-tree=",
                        "--namespace=",
                        "--super-prefix=",
                        "--config-env=",
                        "--list-cmds=",
                        "--attr-source=",
                        "--exec-path=",
                    )
                ):
                    command = rule[1]  # an option not known: loosely
                    break
                elif not word.startswith("-"):
                    command = word
                    break
        if command != rule[1]:
            return False
    args = argv[1:]
    if "--" in args:
        options, operands = args[: args.index("--")], args[args.index("--") + 1 :]
    else:
        options, operands = args, []

    def short(word: str) -> bool:
        return len(word) > 1 and word.startswith("-") and not word.startswith("--")

    letters = {c for w in options if short(w) for c in w[1:]}
    words = iter([w for w in options if not short(w)] + operands)
    for part in rule[1:]:
        if short(part):
            if not set(part[1:]) <= letters:
                return False
        elif not any(w == part for w in words):
            return False
    return True


def linear_decide(rules: CommandRules, argv: list[str] | None,
                  exe: str | None) -> tuple[str, str | None]:  # fmt: skip
    """The policy's documented order, every rule tried in turn: external, an exact grant,
    deny, a covering grant, ask, allow, the default."""
    if argv is None:
        for kind, group in ((DENY, rules.external), (DENY, rules.deny), (ASK, rules.ask)):
            for rule in group:
                if _program_matches(rule[0], exe or "", exe):
                    return kind, shlex.join(rule)
        return rules.default, None
    order = [
        (EXTERNAL, rules.external, reference_covers, False),
        (ALLOW, [*rules.exact, *rules.granted], rule_matches, True),
        (DENY, rules.deny, reference_covers, False),
        (ALLOW, rules.granted, reference_covers, False),
        (ASK, rules.ask, reference_covers, False),
        (ALLOW, rules.allow, rule_matches, False),
    ]
    for kind, group, matches, exact in order:
        for rule in group:
            if (not exact or len(rule) == len(argv)) and matches(rule, argv, exe):
                if group is rules.allow or group is rules.ask or kind != ALLOW:
                    return kind, shlex.join(rule)
                if grant_names(rules, rule, exe):
                    return kind, shlex.join(rule)
    return rules.default, None


def grant_names(rules: CommandRules, rule: list[str], exe: str | None) -> bool:
    """A grant names a program file, never by argv[0]: a path head the file at that path (or,
    outside the agent's places, the file it leads to), a relative one a file of that name;
    a bare name, outside the agent's places, a file PATH found, of that name, or a version
    of it."""

    def agents(path: str) -> bool:
        def under(root: str) -> bool:
            return path == root or path.startswith(root + "/")

        return any(map(under, rules.writable)) and not any(map(under, rules.kept))

    head = rule[0]
    if not exe:
        return False
    if "/" in head and not head.startswith("/"):
        return (bool(rules.worktree) and ".." not in head.split("/")
                and exe == os.path.join(rules.worktree, os.path.normpath(head)))  # fmt: skip
    if "/" in head:
        path = os.path.normpath(head)
        return exe == path or (
            not agents(path) and not agents(exe) and os.path.realpath(path) == exe
        )
    if agents(exe):
        return False
    name = os.path.basename(exe)
    return exe in rules.grant_programs.get(head, []) or (
        name.startswith(head)
        and re.fullmatch(r"([.-][0-9]+(\.[0-9]+)*)?", name[len(head) :]) is not None
    )


def test_a_grant_names_the_users_program_and_never_one_the_agent_can_make(tmp_path: Path) -> None:
    # An approved `python3 -c 'print(1)'`: PATH's python3 is a version manager's shim, which
    # runs the version's python3 (a link to python3.11) in a folder bound read-only in HOME.
    home = tmp_path / "home"
    version = home / ".pyenv/versions/3.11.7/bin"
    version.mkdir(parents=True)
    (version / "python3.11").write_text("")
    (version / "python3").symlink_to("python3.11")
    rules = CommandRules.from_config({
        "ask": ["python3 -c"], "exact": ["python3 -c 'print(1)'"], "default": "allow",
        "grant_programs": {"python3": [f"{home}/.pyenv/shims/python3"]},
        "writable": [str(home), "/tmp", "/srv/repo"], "kept": [f"{home}/.pyenv"],
    })  # fmt: skip
    granted = (ALLOW, "python3 -c 'print(1)'")
    argv = ["-c", "print(1)"]
    assert rules.decide(["python3", *argv], f"{home}/.pyenv/shims/python3") == granted
    # The shim execs the version's python3 by its path: a link to a file of another name.
    real = str(version / "python3.11")
    assert rules.decide([str(version / "python3"), *argv], real) == granted
    assert rules.decide(["python3", *argv], "/usr/bin/python3") == granted  # outside: the user's
    # The agent's: a link of that name in scratch space, a copy, one in the worktree or HOME,
    # or an argv[0] that names another file than the one run.
    asked = (ASK, "python3 -c")
    assert rules.decide(["/tmp/python3", *argv], "/usr/bin/dash") == asked
    assert rules.decide(["python3", *argv], "/tmp/c/python3") == asked
    assert rules.decide(["python3", *argv], f"{home}/bin/python3") == asked
    assert rules.decide(["./python3", *argv], "/srv/repo/python3") == asked
    assert rules.decide(["/usr/bin/python3", *argv], "/usr/bin/dash") == asked
    assert rules.decide([str(version / "python3"), *argv], "/usr/bin/dash") == asked
    # argv[0] is the caller's to choose (`exec -a`): a path that reads as the user's, through
    # `//`, `..` or a link of the agent's, names nothing.
    assert rules.decide(["//srv/repo/python3", *argv], "/usr/bin/perl") == asked
    assert rules.decide([f"{home}/.pyenv/../x/python3", *argv], "/usr/bin/perl") == asked
    # A grant by path names the file there, not what argv[0] says.
    by_path = CommandRules.from_config({
        "exact": ["/usr/bin/python3 -c 'print(2)'", "/tmp/b/pnpm install"], "default": "deny",
        "writable": [str(home), "/tmp", "/srv/repo"], "kept": [],
    })  # fmt: skip
    real = os.path.realpath("/usr/bin/python3")
    assert by_path.decide(["/usr/bin/python3", "-c", "print(2)"], real)[0] == ALLOW
    assert by_path.decide(["/usr/bin/python3", "-c", "print(2)"], "/usr/bin/perl")[0] == DENY
    assert by_path.decide(["/usr/bin/python3", "-c", "print(2)"], "/srv/repo/xx")[0] == DENY
    assert by_path.decide(["/tmp/b/pnpm", "install"], "/tmp/b/pnpm")[0] == ALLOW
    assert by_path.decide(["/tmp/b/pnpm", "install"], "/tmp/b/other")[0] == DENY
    # A relative path names the repository's own file: the one in the worktree, not a file of
    # that name elsewhere (argv[0] and the folder run from are the agent's to choose).
    repo = CommandRules.from_config({
        "exact": ["./gradlew build", "./sub/../gradlew x"], "deny": ["gradlew"],
        "default": "allow", "writable": ["/tmp", "/srv/repo"], "worktree": "/srv/repo",
    })  # fmt: skip
    assert repo.decide(["./gradlew", "build"], "/srv/repo/gradlew")[0] == ALLOW
    for elsewhere in ("/tmp/x/gradlew", "/srv/repo/src/gradlew", "/dev/shm/gradlew"):
        assert repo.decide(["./gradlew", "build"], elsewhere)[0] == DENY, elsewhere
    assert repo.decide(["./sub/../gradlew", "x"], "/srv/repo/gradlew")[0] == DENY
    # A version of a name has a separator before it: cc1 is not a cc.
    assert not rules._grants(["cc"], "/usr/lib/gcc/x86_64-linux-gnu/12/cc1")
    # Exactly the words approved.
    wider = ["python3", "-c", "x", "print(1)"]
    assert rules.decide(wider, f"{home}/.pyenv/shims/python3") == asked


PROGRAMS = ["git", "rm", "sh", "python3", "npm", "curl", "true"]
WORDS = ["push", "status", "-rf", "-r", "-f", "--force", "install", "x", "--", "origin"]


def random_rule(rnd: random.Random) -> str:
    head = rnd.choice(PROGRAMS)
    if rnd.random() < 0.2:
        head = f"/usr/bin/{head}"
    return " ".join([head, *rnd.sample(WORDS, rnd.randint(0, 3))])


def random_exec(rnd: random.Random) -> tuple[list[str] | None, str | None]:
    program = rnd.choice(PROGRAMS)
    argv0 = rnd.choice([program, f"/usr/bin/{program}", f"./{program}", rnd.choice(PROGRAMS)])
    exe = rnd.choice([f"/usr/bin/{program}", f"/tmp/w/{program}", None, ""])
    if rnd.random() < 0.1:
        return None, exe
    if rnd.random() < 0.05:
        return [], exe
    return [argv0, *rnd.choices(WORDS, k=rnd.randint(0, 4))], exe


def test_the_rules_found_by_program_decide_as_every_rule_in_order() -> None:
    rnd = random.Random(20261201)
    for _ in range(300):
        grant_programs = {p: [f"/usr/bin/{p}"] for p in PROGRAMS if rnd.random() < 0.3}
        rules = CommandRules.from_config({
            key: [random_rule(rnd) for _ in range(rnd.randint(0, 6))]
            for key in ("allow", "ask", "deny", "granted", "external", "exact")
        } | {"default": rnd.choice([ALLOW, ASK, DENY]),
             "grant_programs": grant_programs, "writable": ["/tmp", "/usr"],
             "kept": ["/usr/bin"]})  # fmt: skip
        for _ in range(40):
            argv, exe = random_exec(rnd)
            expected = linear_decide(rules, argv, exe)
            for _ in range(2):  # the second answer is the one kept from the first
                assert rules.decide(argv, exe) == expected, (rules, argv, exe)


def test_only_short_command_lines_have_their_answers_kept() -> None:
    """What the agent runs decides what is kept: a long argv, many words or a long path are
    answered anew each time, so the answers kept stay a few MiB however it names things."""
    long_path = "/usr/bin/" + "d/" * 1100 + "rm"
    rules = CommandRules.from_config({"deny": ["rm -rf"], "default": "allow"})
    assert rules.decide(["rm", "-rf", "x" * 3000], "/usr/bin/rm") == (DENY, "rm -rf")
    assert rules.decide(["rm", "-rf", *["a"] * 70], "/usr/bin/rm") == (DENY, "rm -rf")
    assert not rules._answers
    # Decided by its last part alone, a path is kept by that name.
    assert rules.decide(["rm", "-rf"], long_path) == (DENY, "rm -rf")
    assert rules.decide(["rm", "-rf"], "/bin/rm") == (DENY, "rm -rf")
    assert len(rules._answers) == 1
    # Where the whole path counts (a grant is held), a long one is not kept.
    granted = CommandRules.from_config({"deny": ["rm -rf"], "granted": ["ls"]})
    assert granted.decide(["rm", "-rf"], long_path) == (DENY, "rm -rf")
    assert not granted._answers
    assert granted.decide(["rm", "-rf"], "/usr/bin/rm") == (DENY, "rm -rf")
    assert len(granted._answers) == 1


def test_a_rule_naming_a_path_is_asked_where_it_leads_at_every_exec(tmp_path: Path) -> None:
    """Answers are kept for command lines asked again, but never where a rule names a program
    by its path: where that path leads can change during a run (a link on the host)."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.write_text("")
    second.write_text("")
    link = tmp_path / "tool"
    link.symlink_to(first)
    rules = CommandRules.from_config({"deny": [str(link)], "default": "allow"})
    assert rules.decide(["tool"], str(first)) == (DENY, str(link))
    assert rules.decide(["tool"], str(second)) == (ALLOW, None)
    link.unlink()
    link.symlink_to(second)
    assert rules.decide(["tool"], str(first)) == (ALLOW, None)
    assert rules.decide(["tool"], str(second)) == (DENY, str(link))


def test_where_rules_decide_by_name_every_folder_of_a_path_search_gets_one_decision() -> None:
    """A PATH search's misses of one argv get one decision, kept, where decides_by_name says
    the path's folder cannot matter: then every folder's path gets the same decision."""
    rnd = random.Random(20261206)
    by_name = 0
    for _ in range(300):
        keys = ("allow", "ask", "deny", "granted", "external", "exact")
        rules = CommandRules.from_config({
            key: [random_rule(rnd) for _ in range(rnd.randint(0, 4))]
            for key in keys if key in ("allow", "ask", "deny", "external") or rnd.random() < 0.2
        } | {"default": rnd.choice([ALLOW, ASK, DENY]),
             "programs": {"/usr/bin/git": ["git"]} if rnd.random() < 0.2 else {},
             "writable": ["/tmp"], "kept": []})  # fmt: skip
        for _ in range(20):
            argv, _ = random_exec(rnd)
            name = rnd.choice(PROGRAMS)
            paths = [f"{folder}/{name}" for folder in ("/usr/bin", "/tmp/w", "/nothing", "")]
            if not rules.decides_by_name(paths[0]):
                continue
            by_name += 1
            assert all(rules.decides_by_name(p) for p in paths[1:] if p not in rules.programs)
            decisions = {rules.decide(argv, p) for p in paths if p not in rules.programs}
            assert len(decisions) == 1, (rules, argv, paths, decisions)
    assert by_name > 500  # (the rules of most draws name programs by path, or grant some)


def test_the_first_rule_in_order_decides_whichever_name_it_matches_by() -> None:
    # argv[0] and the program file name different programs: each name finds its rules, and
    # the one listed first decides, as in the whole list.
    rules = CommandRules.from_config({"deny": ["rm -rf", "ok", "/tmp/x/curl"], "default": "allow"})
    assert rules.decide(["ok", "-rf"], "/tmp/x/rm") == (DENY, "rm -rf")
    assert rules.decide(["ok"], "/tmp/x/rm") == (DENY, "ok")
    assert rules.decide(["echo"], "/tmp/x/curl") == (DENY, "/tmp/x/curl")
    assert rules.decide(["/tmp/x/curl"], "/usr/bin/echo") == (DENY, "/tmp/x/curl")
    assert rules.decide(["echo", "-rf"], "/usr/bin/echo") == (ALLOW, None)
    # A rule that names a path matches the program file that path leads to.
    by_path = CommandRules.from_config({"deny": ["/bin/sh -c"], "default": "allow"})
    assert by_path.decide(["x", "-c", "id"], os.path.realpath("/bin/sh")) == (DENY, "/bin/sh -c")
    assert by_path.decide(["sh", "-c", "id"], "/tmp/w/sh") == (ALLOW, None)


def test_an_argv_read_once_covers_as_the_word_by_word_match_does() -> None:
    """The decision reads an argv once for every loose rule it tries (_Loose); each answer is
    the word-by-word match's, for words, merged and split short flags, `-`, `--` and repeats."""
    from gatekeeper.sandbox.supervise.rules import _Loose

    words = ["push", "-", "--", "-rf", "-r", "-f", "-fr", "-x", "--force", "a", "b", ""]
    rnd = random.Random(7)
    for _ in range(20_000):
        program = rnd.choice(PROGRAMS)
        rule = [
            rnd.choice([program, f"/usr/bin/{program}"]),
            *rnd.choices(words, k=rnd.randint(0, 3)),
        ]
        argv = [rnd.choice([program, f"/usr/bin/{program}", "other"]),
                *rnd.choices(words, k=rnd.randint(0, 6))]  # fmt: skip
        exe = rnd.choice([f"/usr/bin/{program}", None])
        loose = _Loose(argv, exe)
        for _ in range(2):  # the second answer comes from what the first worked out
            assert loose.covers(rule) == reference_covers(rule, argv, exe), (rule, argv, exe)


def test_thousands_of_approved_command_lines_are_found_by_their_words(monkeypatch) -> None:
    """A chain of resumed runs may approve thousands of command lines: an exec is checked
    against those with its very words, and a program named by a path is resolved only for
    them (a realpath per approval per exec would cost milliseconds each)."""
    import gatekeeper.sandbox.supervise.rules as rules_module

    exact = [f"/usr/bin/python3 -c 'print({i})'" for i in range(10_000)]
    rules = CommandRules.from_config({"exact": exact, "default": DENY,
                                      "deny": ["/usr/bin/curl"]})  # fmt: skip
    resolved: list[str] = []
    realpath = os.path.realpath
    monkeypatch.setattr(rules_module.os.path, "realpath",
                        lambda p: resolved.append(p) or realpath(p))  # fmt: skip
    assert rules.decide(["python3", "-c", "print(4242)"], "/usr/bin/python3") == (
        ALLOW, "/usr/bin/python3 -c 'print(4242)'")  # fmt: skip
    assert rules.decide(["python3", "-c", "print(-1)"], "/usr/bin/python3")[0] == DENY
    assert rules.decide(["sh", "-c", "print(1)"], "/bin/sh")[0] == DENY
    assert len(resolved) <= 3


def test_git_s_own_commands_are_read_as_git_lists_them(tmp_path: Path, monkeypatch) -> None:
    # What the supervisor holds to be git's own commands is git's own listing (builtins, its
    # exec path's git-NAME programs, PATH's), less a name git would list but never run
    # (git-NAME.exe runs no git-NAME): everything else is an alias, refused.
    import subprocess

    from gatekeeper.sandbox.supervise.setup import git_facts

    extra = tmp_path / "bin"
    extra.mkdir()
    for name, mode in (("git-gkfacts", 0o755), ("git-gkplain", 0o644), ("git-gkwin.exe", 0o755)):
        (extra / name).write_text("#!/bin/sh\n")
        (extra / name).chmod(mode)
    (extra / "git-gklink").symlink_to(extra / "git-gkfacts")
    monkeypatch.setenv("PATH", f"{extra}:{os.environ['PATH']}")
    assert git_facts(["curl", "sh -c"])["git_commands"] == []
    facts = git_facts(["git push"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull)
    listed = subprocess.run(["git", "--list-cmds=builtins,main,others"], env=env,
                            capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    builtins = subprocess.run(["git", "--list-cmds=builtins"], env=env,
                              capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    exec_path = subprocess.run(["git", "--exec-path"], env=env,
                               capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert "gkwin" in listed and "gkplain" not in listed
    assert facts["git_commands"] == sorted(set(listed) - {"gkwin"})
    assert facts["git_builtins"] == sorted(builtins) and "push" in builtins
    assert facts["git_exec_path"] == exec_path
    on_path = facts["git_on_path"]
    assert isinstance(on_path, dict)
    assert on_path["gkfacts"] == on_path["gklink"] == str(extra)
    assert "gkwin" not in on_path and "push" not in on_path
