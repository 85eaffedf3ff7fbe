"""Command rules: `rm -rf`, `git push`, `pnpm install` matched against the argv of every exec.

The first word matches the program by basename (or by full path when the rule gives one).
For `allow` the following words must be the argv's next words, in order: allowing is exact.
For `deny` and `ask` matching is deliberately loose, so that rearranging a command does not
get around a rule: the rule's words must appear in the argv in order (other words may stand
between, as in `git -C . push`), and short options may be split, merged or reordered
(`rm -r -f` and `rm -fr` match `rm -rf`).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from gatekeeper.sandbox.supervise.policing import is_within

ALLOW, ASK, DENY = "allow", "ask", "deny"
# A command the policy lists under commands.external: refused inside, performed by the person.
EXTERNAL = "external"
STRICTNESS = {ALLOW: 0, ASK: 1, DENY: 2, EXTERNAL: 3}
# After a rule: the exec was refused by its name where nothing was at its path (a PATH search
# trying each folder with one argv); nothing ran.
NOTHING_THERE = "(by name: no file at the path when judged)"


def split_rule(rule: str) -> list[str]:
    try:
        return shlex.split(rule)
    except ValueError:
        return rule.split()


def _json_list(data: dict[str, object], key: str) -> list[Any]:
    """data[key], a JSON array as the launcher wrote it (absent or null: empty)."""
    return cast("list[Any]", data.get(key) or [])


def _json_object(data: dict[str, object], key: str) -> dict[str, Any]:
    """data[key], a JSON object as the launcher wrote it (absent or null: empty)."""
    return cast("dict[str, Any]", data.get(key) or {})


def _program_matches(head: str, argv0: str, exe: str | None) -> bool:
    names = {argv0} | ({exe} if exe else set())
    if "/" in head:
        return head in names or (exe is not None and os.path.realpath(head) == exe)
    return any(os.path.basename(n) == head for n in names)


# What may follow a program's name in the name of a version of it: python3.11 for python3,
# node-18 for node (nothing: the name itself); a separator first (cc1 is not a cc).
_VERSION = re.compile(r"(?:[.-][0-9]+(?:\.[0-9]+)*)?")


def _is_short_flags(word: str) -> bool:
    return len(word) > 1 and word.startswith("-") and not word.startswith("--")


def rule_matches(rule: list[str], argv: list[str], exe: str | None) -> bool:
    """Exact prefix match (used for allow rules). The words are compared first: a program
    named by a path costs a realpath, and thousands of approved command lines name one."""
    if not rule or not argv or argv[1 : len(rule)] != rule[1:]:
        return False
    return _program_matches(rule[0], argv[0], exe)


class _Loose:
    """The loose match (deny, ask and external rules, a grant's covering): the rule's words
    in the argv in order, its short flags as a set; the argv worked out once for all the
    rules a decision tries."""

    __slots__ = ("argv", "exe", "present", "_letters", "_words")

    def __init__(self, argv: list[str], exe: str | None) -> None:
        self.argv = argv
        self.exe = exe
        self.present = set(argv)  # any word a rule needs is one of these
        self._letters: set[str] | None = None
        self._words: list[str] = []

    def _parse(self) -> set[str]:
        args = self.argv[1:]
        if "--" in args:
            cut = args.index("--")
            options, operands = args[:cut], args[cut + 1 :]
        else:
            options, operands = args, []
        letters: set[str] = set()
        words: list[str] = []
        for word in options:
            if _is_short_flags(word):
                letters.update(word[1:])
            else:
                words.append(word)
        self._words = words + operands
        self._letters = letters
        return letters

    def covers(self, rule: list[str]) -> bool:
        """True when rule covers the argv (see the module's docstring)."""
        if not rule or not self.argv:
            return False
        present = self.present
        if any(part not in present for part in rule[1:] if not _is_short_flags(part)):
            return False  # a word the rule needs is nowhere in the argv
        if not _program_matches(rule[0], self.argv[0], self.exe):
            return False
        if names_git(rule[0]) and len(rule) > 1 and not rule[1].startswith("-"):
            # A rule's second word names git's command: the one git runs, read past git's own
            # options (`git -C . push` is `git push`; `git stash push` is not).
            # (After an option gatekeeper does not know, the words are matched loosely: an
            # exec naming none of git's own commands is refused by itself, _git_unknown.)
            dashed = _as_git(self.argv)
            command = git_command(dashed or self.argv)
            if command != rule[1] and command != GIT_UNKNOWN_OPTION:
                return False
        letters = self._letters if self._letters is not None else self._parse()
        words = iter(self._words)
        for part in rule[1:]:
            if _is_short_flags(part):
                if not set(part[1:]) <= letters:
                    return False
            elif not any(w == part for w in words):
                return False
        return True


class _Indexed:
    """One list of rules, found by the program they name: the supervisor decides every exec,
    and a policy's rules name a few programs each, so only those that could match are tried.

    A rule whose first word has no `/` can match only a program of that basename (argv[0]'s
    or the program file's); one with a `/` is always tried. Candidates keep the list's order,
    so the first rule that matches is the one the whole list would give.
    """

    def __init__(self, rules: list[list[str]]) -> None:
        self.rules = rules
        self.by_name: dict[str, list[int]] = {}
        self.by_path: list[int] = []
        self.by_words: dict[tuple[str, ...], list[int]] = {}  # the words after the program's
        for index, rule in enumerate(rules):
            if not rule:
                continue  # matches nothing
            self.by_words.setdefault(tuple(rule[1:]), []).append(index)
            if "/" in rule[0]:
                self.by_path.append(index)
            else:
                self.by_name.setdefault(rule[0], []).append(index)

    def candidates(self, names: tuple[str, ...]) -> list[list[str]]:
        """The rules that could match a program whose basenames (argv[0]'s, the file's) are
        names, in the list's order."""
        found = [i for name in names for i in self.by_name.get(name, ())]
        if self.by_path:
            found += self.by_path
        if not found:
            return []
        if len(found) > 1:
            found = sorted(set(found))
        return [self.rules[i] for i in found]

    def exact_candidates(self, names: tuple[str, ...], argv: list[str]) -> list[list[str]]:
        """candidates() that are argv word for word but for the program (an approved command
        line allows only itself, and a chain of runs may approve thousands)."""
        found = self.by_words.get(tuple(argv[1:]), ())
        rules = (self.rules[i] for i in found)
        return [rule for rule in rules if "/" in rule[0] or rule[0] in names]


# git's options before its command (git.c's handle_options, 2.39 and later): those that take
# the next word as their value, those of the form `--NAME=VALUE`, and those that take none.
# Any other word starting with `-` there is none git is known to read: see git_command.
_GIT_VALUED = frozenset({"-c", "-C", "--git-dir", "--work-tree", "--namespace",
                         "--super-prefix", "--config-env", "--list-cmds", "--attr-source",
                         "--shallow-file"})  # fmt: skip
_GIT_JOINED = ("--git-dir=", "--work-tree=", "--namespace=", "--super-prefix=", "--config-env=",
               "--list-cmds=", "--attr-source=", "--exec-path=")  # fmt: skip
_GIT_FLAGS = frozenset({
    "-p", "--paginate", "-P", "--no-pager", "--no-replace-objects", "--no-lazy-fetch",
    "--no-optional-locks", "--no-advice", "--bare", "--literal-pathspecs",
    "--no-literal-pathspecs", "--glob-pathspecs",
    "--noglob-pathspecs", "--icase-pathspecs", "--exec-path", "--html-path", "--man-path",
    "--info-path", "-v", "--version", "-h", "--help",
})  # fmt: skip
# What git_command gives for an option before the command that git is not known to read.
GIT_UNKNOWN_OPTION = "\0option"


# Why an exec of git is refused when it is asked to find one of its commands elsewhere.
GIT_ELSEWHERE = (
    "(git asked to find its command `{word}` in another exec path ({how}): where it is not "
    "found there, git runs the word as an alias, which could be any command a rule names)"
)


def names_git(word: str) -> bool:
    """Whether a rule's first word names git: `git`, or a path to a file called git."""
    return word == "git" or word.endswith("/git")


def git_command(argv: list[str]) -> str | None:
    """The command word of a git argv (after git's own options), None when there is none
    (`git --version`); GIT_UNKNOWN_OPTION for an option there git is not known to read (it
    may take the next word, and the command be another)."""
    words = iter(argv[1:])
    for word in words:
        if word in _GIT_VALUED:
            next(words, None)
        elif word in _GIT_FLAGS or word.startswith(_GIT_JOINED):
            continue
        elif word.startswith("-"):
            return GIT_UNKNOWN_OPTION
        else:
            return word
    return None


def _as_git(argv: list[str]) -> list[str] | None:
    """`git NAME ARGS` for an argv whose first word's last part is `git-NAME`: git runs it so
    (a link to git named so in its exec path, or git started with that argv[0]); else None."""
    first = os.path.basename(argv[0])
    if first.startswith("git-") and len(first) > 4:
        return ["git", first[4:], *argv[1:]]
    return None


_A = TypeVar("_A")

# The answers of the rules kept for the same command line asked again (CommandRules._asked):
# how many, and the longest command line kept.
MEMO_ENTRIES = 1024
MEMO_WORDS = 64
MEMO_CHARACTERS = 2048  # of the argv and the program's path together


@dataclass
class CommandRules:
    allow: list[list[str]]
    ask: list[list[str]]
    deny: list[list[str]]
    default: str
    granted: list[list[str]]
    external: list[list[str]] = field(default_factory=list)
    # The program file a rule's bare name leads to where the file has another name (a link:
    # `sh` is dash, `python3` is python3.11) -> those names: the file is that program however
    # it is called (its own name, a link of the agent's, any argv[0]).
    programs: dict[str, list[str]] = field(default_factory=dict)
    # Command lines approved as decision points: each allows only an exec of exactly its
    # words, never one it would cover loosely (an approval is of what the agent ran).
    exact: list[list[str]] = field(default_factory=list)
    # A grant's (or an approval's) bare program name -> the program files it finds on PATH:
    # a grant names those, and no file of that name in a place the agent writes (a copy of a
    # shell called `python3`): see _grants.
    grant_programs: dict[str, list[str]] = field(default_factory=dict)
    # Where the agent can make files (the worktree, scratch space, the sandbox's /dev): a
    # program there is the agent's, whatever its name, and no grant by name names it.
    writable: list[str] = field(default_factory=list)
    # Folders bound read-only inside those places (toolchains in HOME: ~/.pyenv, ~/.cargo):
    # the user's programs, not the agent's.
    kept: list[str] = field(default_factory=list)
    # The run's worktree: a grant of a relative path (`./gradlew`) names the file there.
    worktree: str = ""
    # (st_dev, st_ino) of each program file a deny, ask or external rule's bare name finds ->
    # those names: a hard link of it (`perl5.36.0` is `perl`) is that program under any name.
    program_ids: dict[tuple[int, int], list[str]] = field(default_factory=dict)
    # git's own commands (builtins, and git-NAME programs in its exec path and on PATH), read
    # before the run when a deny, ask or external rule names git: see _git_unknown.
    git_commands: frozenset[str] = frozenset()
    # Of those, the ones built into git (the others it runs as git-NAME programs it finds in
    # its exec path, or on PATH: see git_finds_by_path).
    git_builtins: frozenset[str] = frozenset()
    # Where git finds those programs unless pointed elsewhere (and what it passes on in
    # GIT_EXEC_PATH to what it runs).
    git_exec_path: str = ""
    # The git-NAME programs git finds on PATH, not in its exec path: NAME -> the folder.
    git_on_path: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        lists = (self.allow, self.ask, self.deny, self.granted, self.external, self.exact)
        self._allow, self._ask, self._deny, self._granted, self._external, self._exact = (
            _Indexed(rules) for rules in lists
        )
        # Most programs an agent runs are named by no rule: they get the default at once.
        indexed = (self._allow, self._ask, self._deny, self._granted, self._external,
                   self._exact)  # fmt: skip
        self._named = {name for rules in indexed for name in rules.by_name}
        self._by_path = any(rules.by_path for rules in indexed)
        # Answers given, by what was asked (see _asked): the same commands run again and again.
        self._answers: dict[tuple[object, ...], object] = {}

    def _asked(self, kind: str, argv: list[str] | None, exe: str | None,
               identity: tuple[int, int] | None = None) -> tuple[object, ...] | None:  # fmt: skip
        """What an answer is kept by: the question and its whole argv, when the answer can
        only be the same next time. It can where no rule names a program by its path (such
        a rule asks where the path leads, which can change on the host); then the rules
        answer from the argv, the program's path and identity and their own words alone.
        Only short command lines are kept (MEMO_WORDS words, MEMO_CHARACTERS characters with
        the path): at most a few MiB for all MEMO_ENTRIES, whatever the agent runs."""
        if (
            self._by_path
            or argv is None
            or len(argv) > MEMO_WORDS
            or sum(map(len, argv)) + len(exe or "") > MEMO_CHARACTERS
        ):
            return None
        return (kind, exe, identity, *argv)

    def _answer(self, key: tuple[object, ...] | None, work: Callable[[], _A]) -> _A:
        """The answer kept for key, or work's (kept, when key is not None)."""
        if key is None:
            return work()
        answer = self._answers.get(key)
        if answer is None:
            answer = work()
            if len(self._answers) >= MEMO_ENTRIES:
                self._answers.clear()
            self._answers[key] = answer
        return cast("_A", answer)

    @classmethod
    def from_config(cls, data: dict[str, object]) -> CommandRules:
        def rules(key: str) -> list[list[str]]:
            return [split_rule(r) for r in _json_list(data, key)]

        programs = _json_object(data, "programs")
        grant_programs = _json_object(data, "grant_programs")
        git_on_path = _json_object(data, "git_on_path")
        program_ids = {
            (int(dev), int(ino)): [str(n) for n in names]
            for dev, ino, names in _json_list(data, "program_ids")
        }
        return cls(rules("allow"), rules("ask"), rules("deny"), str(data.get("default", ALLOW)),
                   rules("granted"), rules("external"),
                   {str(k): [str(n) for n in v] for k, v in programs.items()},
                   rules("exact"),
                   {str(k): [str(n) for n in v] for k, v in grant_programs.items()},
                   [str(w) for w in _json_list(data, "writable")],
                   [str(k) for k in _json_list(data, "kept")],
                   str(data.get("worktree", "")), program_ids,
                   frozenset(str(c) for c in _json_list(data, "git_commands")),
                   frozenset(str(c) for c in _json_list(data, "git_builtins")),
                   str(data.get("git_exec_path") or ""),
                   {str(k): str(v) for k, v in git_on_path.items()})  # fmt: skip

    def by_default(self, argv0: str, exe: str) -> bool:
        """True when no rule can name an exec of exe called argv0 (by either one's basename,
        by a path, or as the program file a rule's name leads to): decide gives the default
        then, whatever the other words of the argv are."""
        if not self.may_default(exe):
            return False
        if _as_git([argv0]) is not None and not self._unnamed(("git",)):
            return False
        return self._unnamed((os.path.basename(argv0),))

    def may_default(self, exe: str) -> bool:
        """False when a rule names exe by its path or its last part: by_default is then False
        whatever argv[0] is."""
        return exe not in self.programs and self._unnamed((os.path.basename(exe),))

    def decides_by_name(self, exe: str) -> bool:
        """True when decide gives the same for exe as for any path of the same last part,
        whatever the argv: no rule names a program by its path, no grant is there (a grant
        names the files it covers) and exe is no file a rule's name leads to."""
        return not (self._by_path or self.granted or self.exact or exe in self.programs)

    def _unnamed(self, names: tuple[str, ...]) -> bool:
        """True when no rule can match a program of these basenames (argv[0]'s, the file's):
        none names one of them, and none names a program by its path."""
        return not self._by_path and not any(name in self._named for name in names)

    def _grants(self, rule: list[str], exe: str | None) -> bool:
        """Whether a grant's rule names the program file exe (the file run, as the process
        sees it), whatever argv[0] says.

        A first word with a path names the file at that path: exe itself, or, outside the
        places the agent writes, the file it leads to (`/usr/bin/python3` is python3.11);
        a relative one, the file at that path in the worktree (the repository's own). A bare
        name names, outside the places the agent writes, the files it finds on PATH (see
        grant_programs), a file of that name, or a version of it (python3.11 for python3: a
        version manager's shim runs the version's python3, a link to it). Never a program in
        the worktree (but by a relative path), scratch space or the sandbox's /dev: the agent
        can put anything there under any name (a copy of a shell called `python3`), and a
        program the run installed is the agent's.
        """
        if not exe:
            return False
        head = rule[0]
        if "/" in head and not head.startswith("/"):
            # The repository's own (`./gradlew`, `bin/tool`): that file in the worktree.
            if not self.worktree or ".." in head.split("/"):
                return False
            return exe == os.path.join(self.worktree, os.path.normpath(head))
        if "/" in head:
            path = os.path.normpath(head)
            if exe == path:
                return True
            if self._writable(path) or self._writable(exe):
                return False
            return os.path.realpath(path) == exe
        if self._writable(exe):
            return False
        if exe in self.grant_programs.get(head, ()):
            return True
        name = os.path.basename(exe)
        return name.startswith(head) and _VERSION.fullmatch(name[len(head) :]) is not None

    @property
    def refuses_anything(self) -> bool:
        """Does any rule (or the default) refuse or ask: is a program that cannot be judged
        to be refused?"""
        return bool(self.deny or self.ask or self.external) or self.default != ALLOW

    def may_change(self, path: str) -> bool:
        """Could the agent make path lead elsewhere: is it, or a folder on the way, in a
        place it writes (a name there can be renamed over, a link swapped), or in /proc?"""
        parts = [p for p in os.path.normpath(path).split("/") if p]
        for end in range(1, len(parts) + 1):
            prefix = "/" + "/".join(parts[:end])
            if prefix == "/proc" or self._writable(prefix):
                return True
        return False

    def _writable(self, path: str) -> bool:
        """In a place the agent can write, and not in a folder bound read-only there."""
        return any(is_within(path, w) for w in self.writable) and not any(
            is_within(path, k) for k in self.kept
        )

    def decide(self, argv: list[str] | None, exe: str | None) -> tuple[str, str | None]:
        """(decision, the rule that decided) for an exec (see _decide), also as the program
        the rules name the program file by (programs): the stricter of the two."""
        # Where the rules decide by the program's last part alone, the answer holds for a path
        # of that name in any folder: a PATH search tries folder after folder with one argv.
        # (A path with no last part, "" or "/", is not a name: decide tells it from none.)
        name = os.path.basename(exe or "")
        by_name = bool(name) and exe is not None and self.decides_by_name(exe)
        key = self._asked("decide by name" if by_name else "decide", argv,
                          name if by_name else exe)  # fmt: skip
        return self._answer(key, lambda: self._decide_as_named(argv, exe))

    def _decide_as_named(self, argv: list[str] | None, exe: str | None) -> tuple[str, str | None]:
        decision, rule = self._decide(argv, exe)
        for name in self.programs.get(exe or "", ()):
            decision, rule = self._also_as(name, argv, exe, (decision, rule))
        dashed = _as_git(argv) if argv else None
        if dashed is not None and not self._unnamed(("git",)):
            # git runs `git-NAME ARGS` as `git NAME ARGS`, whatever file runs it.
            named = self._decide(dashed, exe, "git")
            if STRICTNESS.get(named[0], 2) > STRICTNESS.get(decision, 2):
                decision, rule = named
        if decision in (ALLOW, ASK) and argv and self.git_commands:
            unknown = self._git_unknown(argv, exe)
            if unknown is not None:
                return DENY, unknown
        return decision, rule

    def _as_git_runs(
        self, argv: list[str], exe: str | None, identity: tuple[int, int] | None = None
    ) -> list[str] | None:
        """The argv as git reads it (`git ARGS`) when the exec runs git by argv[0]'s name,
        the file's, or as the file a rule's `git` finds (a hard link of it under any name);
        None otherwise, and for a dashed argv[0] (`git-NAME`: git then runs the builtin
        NAME, no alias, no correction)."""
        if _as_git(argv) is not None:
            return None
        if (
            os.path.basename(argv[0]) == "git"
            or os.path.basename(exe or "") == "git"
            or (identity is not None and any(map(names_git, self.program_ids.get(identity, ()))))
        ):
            return ["git", *argv[1:]]
        return None

    def git_finds_by_path(
        self, argv: list[str] | None, exe: str | None, identity: tuple[int, int] | None = None
    ) -> bool:
        """Whether an exec of git names one of its commands that are programs (git-NAME),
        which git finds in its exec path (GIT_EXEC_PATH in its environment may point it
        elsewhere) and, where they are not found there, runs as an alias: the caller then
        reads its environment (GIT_ELSEWHERE)."""
        if not argv or not self.git_commands:
            return False
        key = self._asked("git_finds_by_path", argv, exe, identity)
        return self._answer(key, lambda: self._git_finds_by_path(argv, exe, identity))

    def _git_finds_by_path(
        self, argv: list[str], exe: str | None, identity: tuple[int, int] | None
    ) -> bool:
        runs = self._as_git_runs(argv, exe, identity)
        word = git_command(runs) if runs is not None else None
        return word is not None and word in self.git_commands and word not in self.git_builtins

    def is_git_exec_path(self, path: str) -> bool:
        """Whether path names git's own exec path (as git passes it on)."""
        return bool(self.git_exec_path) and path.rstrip("/") == self.git_exec_path.rstrip("/")

    def _git_unknown(
        self, argv: list[str], exe: str | None, identity: tuple[int, int] | None = None
    ) -> str | None:
        """Why an exec of git is refused when the command it names is none of git's own, or
        None. git runs such a word as an alias (which the agent may define in its own
        config) or, with help.autocorrect, as the command it is closest to: `git psh` can
        push, in git's own process, with no exec a rule could see. So where a rule refuses
        or asks about some of git's commands (git_commands is read then), only git's own
        commands are run by name."""
        runs = self._as_git_runs(argv, exe, identity)
        if runs is None:
            return None
        word = git_command(runs)
        if word is None:
            return None
        if word == GIT_UNKNOWN_OPTION:
            return (
                "(git given an option before its command that gatekeeper does not know: it "
                "may take the next word, and git run another command than the one judged)"
            )
        if word in self.git_commands:
            if word in self.git_builtins or all(
                self.is_git_exec_path(a.partition("=")[2])
                for a in runs[1:]  # (git's own options come before the command; any will do)
                if a.startswith("--exec-path=")
            ):
                return None
            return GIT_ELSEWHERE.format(word=word[:40], how="--exec-path")
        return (
            f"(git runs `{word[:40]}`, none of its own commands, as an alias or a correction: "
            "it could be any command a rule names; call git's own command, or a git-NAME "
            "program by its own name)"
        )

    def by_identity(
        self, identity: tuple[int, int] | None, argv: list[str] | None, exe: str | None
    ) -> tuple[str, str | None]:
        """The decision for an exec of the program file identity (its device and inode) as
        each name a rule finds it by (see program_ids): the strictest; the default's
        ALLOW when no rule names that file."""
        key = self._asked("by_identity", argv, exe, identity)
        return self._answer(key, lambda: self._by_identity(identity, argv, exe))

    def _by_identity(
        self, identity: tuple[int, int] | None, argv: list[str] | None, exe: str | None
    ) -> tuple[str, str | None]:
        verdict: tuple[str, str | None] = (ALLOW, None)
        for name in self.program_ids.get(identity, ()) if identity is not None else ():
            verdict = self._also_as(name, argv, exe, verdict)
        if verdict[0] in (ALLOW, ASK) and argv and self.git_commands:
            unknown = self._git_unknown(argv, exe, identity)  # (git under another name)
            if unknown is not None:
                return DENY, unknown
        return verdict

    def _also_as(
        self, name: str, argv: list[str] | None, exe: str | None, verdict: tuple[str, str | None]
    ) -> tuple[str, str | None]:
        """The stricter of verdict and the decision for the exec as if called name."""
        if argv and os.path.basename(argv[0]) == name:
            return verdict  # called by that name already
        named = self._decide(None if argv is None else [name, *argv[1:]], exe, name)
        if STRICTNESS.get(named[0], 2) > STRICTNESS.get(verdict[0], 2):
            return named
        return verdict

    def _decide(self, argv: list[str] | None, exe: str | None,
                probe_name: str | None = None) -> tuple[str, str | None]:  # fmt: skip
        """(decision, the rule that decided) for an exec.

        External wins over everything (no grant runs it inside); then a grant of exactly this
        command line (a person named it, as an approved `command` decision point is granted
        on resume) over a deny rule; deny over ask, ask over allow. argv None means it could
        not be read: any external, deny or ask rule for the same program then refuses, since
        its arguments cannot be checked.
        """
        if argv is None:
            probe = probe_name or exe or ""
            names: tuple[str, ...] = (os.path.basename(probe),)
            for kind, rules in ((DENY, self._external), (DENY, self._deny), (ASK, self._ask)):
                for rule in rules.candidates(names):
                    if _program_matches(rule[0], probe, exe):
                        return kind, shlex.join(rule)
            return self.default, None
        if not argv:
            return self.default, None  # no rule matches an empty argv
        first = os.path.basename(argv[0])
        names = (first,) if not exe or (own := os.path.basename(exe)) == first else (first, own)
        if self._unnamed(names):
            return self.default, None
        loose = _Loose(argv, exe)
        for rule in self._external.candidates(names):
            if loose.covers(rule):
                return EXTERNAL, shlex.join(rule)
        granted = self._granted.candidates(names)
        for rule in (*self._exact.exact_candidates(names, argv), *granted):
            exact = len(rule) == len(argv) and rule_matches(rule, argv, exe)
            if exact and self._grants(rule, exe):
                return ALLOW, shlex.join(rule)
        for rule in self._deny.candidates(names):
            if loose.covers(rule):
                return DENY, shlex.join(rule)
        for rule in granted:
            if loose.covers(rule) and self._grants(rule, exe):
                return ALLOW, shlex.join(rule)
        for rule in self._ask.candidates(names):
            if loose.covers(rule):
                return ASK, shlex.join(rule)
        for rule in self._allow.candidates(names):
            if rule_matches(rule, argv, exe):
                return ALLOW, shlex.join(rule)
        return self.default, None
