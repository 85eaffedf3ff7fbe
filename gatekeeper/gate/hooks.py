"""What the git hooks decide: the server's pre-receive (the enforcement) and the local
pre-push and pre-merge-commit (a convenience that says the same thing earlier)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from gatekeeper.errors import UsageError
from gatekeeper.gate.diffread import DiffTooLarge, git_time
from gatekeeper.gate.history import EMPTY_TREE, merge_base
from gatekeeper.gate.judgement import judge
from gatekeeper.gate.notes import lost_lines
from gatekeeper.gate.refs import (
    ALLOW_REWIND_KEY,
    RefUpdate,
    branches,
    configured_protect,
    default_branch,
    full_ref,
    has_commit,
    is_protected,
    parse_updates,
    protects_default,
    resolve_oid,
    rewind_allowed,
    rewind_problem,
    server_defaults,
)
from gatekeeper.gate.result import GateResult
from gatekeeper.gate.shown import capped, visible, visible_lines
from gatekeeper.git import ZERO_OID, git, is_ancestor, read_blob_at
from gatekeeper.policy.model import POLICY_PATH, TRUST_PATH
from gatekeeper.receipt.notes import NOTES_REF

Say = Callable[[str], None]

MERGE_NOTES_HINT = (
    "fetch and merge the receipts, then push again:\n"
    f"  git fetch origin +{NOTES_REF}:refs/notes/remotes/origin/gatekeeper\n"
    "  git notes --ref=gatekeeper merge -s cat_sort_uniq refs/notes/remotes/origin/gatekeeper"
)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def shown(say: Say) -> Say:
    """say, with every line made visible (gate.shown): ref names, paths, subjects and other
    text from the repository reach the pusher's terminal as escapes, never as its commands."""
    if getattr(say, "_gatekeeper_shown", False):
        return say

    def escaped(text: str) -> None:
        say(visible_lines(text))

    escaped._gatekeeper_shown = True  # type: ignore[attr-defined]
    return escaped


def explain(ref: str, result: GateResult, say: Say) -> None:
    """The verdict for one ref and its findings, one line each (at most SHOWN_PER_KIND of
    each kind, then how many more), for the pusher to read."""
    say(
        f"gatekeeper: {visible(ref)}: {result.verdict.value.upper()} "
        f"({result.receipts_verified} receipt(s) verified, {len(result.findings)} finding(s)"
        f"{result.ignored_text})"
    )
    for f in capped(result.findings):
        if isinstance(f, tuple):
            kind, more = f
            say(
                f"gatekeeper:   ... and {more} more {kind.value} finding(s) "
                "(`gatekeeper check --format json` lists all)"
            )
            continue
        where = f" [{f.path!r}]" if f.path else ""
        say(visible(f"gatekeeper:   {f.kind.value}{where}: {f.message}"))


# --- server -----------------------------------------------------------------------------------


def server_protected(git_dir: Path) -> list[str]:
    """`gatekeeper.protect` patterns and the repository's default branch.

    The default branch is protected also when other patterns are given (unless
    `gatekeeper.protectDefault` is false): what judges a new protected ref must itself be
    guarded, or anyone could first put their key into its trust file.
    """
    patterns = configured_protect(git_dir)
    if protects_default(git_dir) or not patterns:
        defaults, _ = server_defaults(git_dir)
        patterns = [*(d for d in defaults if not is_protected(d, patterns)), *patterns]
    return patterns


def _notes_problem(git_dir: Path, update: RefUpdate) -> str | None:
    if update.is_delete:
        return f"deleting {NOTES_REF} would drop every receipt; refused"
    # The old value is the pusher's word: judged against it, a made-up one (a "create", or an
    # older notes commit) would let the push leave out lines the server holds, a later denial
    # among them. git compares it only when it updates the ref, after the protected refs of
    # the same push may have been judged with these notes and moved.
    current = resolve_oid(git_dir, NOTES_REF) or ZERO_OID
    if update.old != current:
        return (
            f"{NOTES_REF}: this push expects the server's receipts at {update.old[:12]}, but they "
            f"are at {current[:12]} (another push changed them, or the old value is not the "
            f"server's); {MERGE_NOTES_HINT}"
        )
    # Only a commit is a notes ref (a tree there would leave every later push of receipts
    # unable to descend from it, and with it every push the gate judges).
    kind = git("cat-file", "-t", update.new, git_dir=git_dir, check=False).decode().strip()
    if kind != "commit":
        return f"{NOTES_REF} must point at a notes commit, not a {kind or 'missing object'}"
    if not update.is_create and not is_ancestor(git_dir, update.old, update.new):
        return (
            f"{NOTES_REF} does not descend from the server's receipts, so receipts would be "
            f"lost; {MERGE_NOTES_HINT}"
        )
    # Descending is not enough: a new notes commit may drop notes. Receipts and approvals
    # are append-only.
    base = update.old if not update.is_create else EMPTY_TREE
    try:
        lost = lost_lines(git_dir, base, update.new)
    except DiffTooLarge as exc:
        return f"{NOTES_REF}: {exc.message}"
    if lost:
        return (
            f"{NOTES_REF}: receipts and approvals may be added, never removed or changed: "
            + "; ".join(lost[:10])
            + (f"; and {len(lost) - 10} more" if len(lost) > 10 else "")
            + f". {MERGE_NOTES_HINT}"
        )
    return None


def fork_targets(git_dir: Path, new: str, candidates: dict[str, str]) -> list[tuple[str, str]]:
    """The protected refs a new ref at commit new forks from: (name, commit) of those whose
    merge-base with new is the nearest (no other candidate's is a descendant of it).

    Several come back when they tie (the same merge-base, different tips); the new ref must
    pass against each, so the weakest trust file cannot be picked. Empty when new shares no
    history with any candidate.
    """
    by_tip: dict[str, str | None] = {}  # protected refs often share a tip: one merge-base each
    for tip in candidates.values():
        if tip not in by_tip:
            by_tip[tip] = merge_base(git_dir, tip, new)
    bases = {name: base for name, tip in candidates.items() if (base := by_tip[tip]) is not None}
    distinct = set(bases.values())
    nearest_bases = {
        base
        for base in distinct
        if not any(other != base and is_ancestor(git_dir, base, other) for other in distinct)
    }
    return [(name, candidates[name]) for name in sorted(bases) if bases[name] in nearest_bases]


def _protected_tips(git_dir: Path, patterns: list[str], skip: str) -> dict[str, str]:
    """Every existing protected ref (but skip) and its commit, listed by one git call."""
    listed = git("for-each-ref", "--format=%(objecttype) %(objectname) %(refname)", "refs/",
                 git_dir=git_dir).decode("utf-8", "surrogateescape")  # fmt: skip
    tips: dict[str, str] = {}
    for line in listed.splitlines():
        kind, oid, ref = line.split(" ", 2)
        if ref == skip or not is_protected(ref, patterns):
            continue
        commit = oid if kind == "commit" else resolve_oid(git_dir, ref)  # (a tag: peeled)
        if commit:
            tips[ref] = commit
    return tips


def _holder(git_dir: Path, new: str, tips: dict[str, str]) -> str | None:
    """The first protected ref (of tips) whose commit holds new, found by one git call."""
    out = git("for-each-ref", f"--contains={new}", "--format=%(refname)", "refs/",
              git_dir=git_dir, check=False).decode("utf-8", "surrogateescape")  # fmt: skip
    return next((ref for ref in sorted(out.splitlines()) if ref in tips), None)


def _is_start(git_dir: Path, ref: str, patterns: list[str]) -> bool:
    """Whether a protected ref created here is the starting point, whose policy and trust file
    judge later pushes: the repository has no branch yet, or ref is a name the default branch
    may take while it has none (server_defaults) and no protected ref exists (another branch
    pushed first must not leave the team's default unable to start)."""
    if not branches(git_dir):
        return True
    defaults, settled = server_defaults(git_dir)
    return not settled and ref in defaults and not _protected_tips(git_dir, patterns, ref)


def _bootstrap_problem(git_dir: Path, update: RefUpdate) -> str | None:
    """The first protected branch must carry what judges every later push."""
    missing = [p for p in (POLICY_PATH, TRUST_PATH) if read_blob_at(git_dir, update.new, p) is None]
    if not missing:
        return None
    return (
        f"{update.ref}: the first protected branch must carry {' and '.join(missing)}, or "
        "nothing can judge later pushes; run `gatekeeper init` and commit .gatekeeper/"
    )


REPLACE_REFS = "refs/replace/"


def _replace_problem(update: RefUpdate) -> str | None:
    """A replace ref makes git show one object's content under another's id; never accepted."""
    if not update.ref.startswith(REPLACE_REFS) or update.is_delete:
        return None
    return (
        f"{update.ref}: pushing replace refs is refused: git would show another object's "
        "content in place of the one named, so what is judged would not be what lands "
        "(the gate reads real objects only; deleting a replace ref is allowed)"
    )


def current_rules(git_dir: Path, patterns: list[str], ref: str, new: str) -> list[tuple[str, str]]:
    """(name, commit) whose trust file and policy are what the repository trusts now.

    The current tip of the default branch when it is protected; else the current tips of the
    other protected refs that new forks from. A protected ref's own tip may hold an older trust
    file (created at an old commit, rewound, or left behind by a revocation), so every update
    of it must also pass against these.
    """
    defaults, settled = server_defaults(git_dir)
    if settled and is_protected(defaults[0], patterns):
        tip = resolve_oid(git_dir, defaults[0])
        if tip is not None:
            return [(defaults[0], tip)]
    return fork_targets(git_dir, new, _protected_tips(git_dir, patterns, ref))


def _rewound_rules_problem(git_dir: Path, update: RefUpdate) -> str | None:
    """A rewind may not bring back another trust file or policy: nothing claims that change."""
    changed = [
        p
        for p in (TRUST_PATH, POLICY_PATH)
        if read_blob_at(git_dir, update.old, p) != read_blob_at(git_dir, update.new, p)
    ]
    if not changed:
        return None
    return (
        f"{update.ref}: this rewind would change {' and '.join(changed)} from what "
        f"{update.old[:12]} holds, and a rewind's judgement does not see that change (it could "
        "bring back a revoked key or a looser policy); change them in a forward update instead"
    )


Judgement = tuple[str, str, str, str]  # range base, rules commit, rules name, why


def _judgements(
    git_dir: Path, update: RefUpdate, targets: list[tuple[str, str]], patterns: list[str]
) -> list[Judgement]:
    """Each range base with the ref's own rules, then with what the repository trusts now."""
    plan: list[Judgement] = [(tip, tip, name, "") for name, tip in targets]
    done = {(tip, tip) for _, tip in targets}
    for name, rules in current_rules(git_dir, patterns, update.ref, update.new):
        for _, base in targets:
            # A range already judged by these very rules (its base is their tip) is not
            # judged twice.
            if (base, rules) not in done:
                done.add((base, rules))
                plan.append((base, rules, name, "what this repository trusts now"))
    return plan


# A push's judgements (each ref's, twice where two rules commits judge it) share one bound on
# git's processor time (gate.diffread): a push of many refs or many merges costs as one.
PUSH_LISTINGS = "the listings git made to judge this push"


def pre_receive(git_dir: Path, stdin: bytes, say: Say = _stderr) -> int:
    """The server's hook (see _pre_receive), git's processor time bounded for the push."""
    with git_time(PUSH_LISTINGS):
        return _pre_receive(git_dir, stdin, say)


def _pre_receive(git_dir: Path, stdin: bytes, say: Say = _stderr) -> int:
    """Judge every update to a protected ref; receipts come from the notes being pushed.

    What the update adds is judged by the trust file and policy of the ref's old tip (or of
    the protected refs a new ref forks from) and, when that is another commit, again by those
    of the default branch's current tip: both must pass, so an old base never brings back a
    revoked key or a looser policy.
    """
    say = shown(say)
    updates = parse_updates(stdin)
    problems: list[str] = [p for u in updates if (p := _replace_problem(u))]
    notes_oid = resolve_oid(git_dir, NOTES_REF)
    notes_label = NOTES_REF
    for update in updates:
        if update.ref == NOTES_REF:
            problem = _notes_problem(git_dir, update)
            if problem:
                problems.append(problem)
            elif not update.is_delete:
                notes_oid, notes_label = update.new, f"{NOTES_REF} (pushed)"
    sources = [(notes_label, notes_oid)] if notes_oid else []

    patterns = server_protected(git_dir)
    blocked = False
    for update in updates:
        if update.ref == NOTES_REF or not is_protected(update.ref, patterns):
            continue
        if update.is_delete:
            problems.append(f"{update.ref}: deleting a protected ref is refused")
            continue
        if not update.is_create:
            rewound = rewind_problem(git_dir, update.ref, update.old, update.new)
            if rewound and not rewind_allowed(update.ref, git_dir):
                problems.append(rewound)
                continue
            if rewound:
                problem = _rewound_rules_problem(git_dir, update)
                if problem:
                    problems.append(problem)
                    continue
                say(f"gatekeeper: {update.ref}: a rewind, allowed by {ALLOW_REWIND_KEY}")
        targets = [(update.ref, update.old)]
        if update.is_create:
            if _is_start(git_dir, update.ref, patterns):
                problem = _bootstrap_problem(git_dir, update)
                if problem:
                    problems.append(problem)
                else:
                    say(
                        f"gatekeeper: {update.ref}: the first protected branch here; accepted "
                        "as the starting point (its policy and trust file judge every later push)"
                    )
                continue
            tips = _protected_tips(git_dir, patterns, update.ref)
            holder = _holder(git_dir, update.new, tips)
            if holder is not None:
                # It adds no commits, so there is nothing to judge; its (possibly older) trust
                # file never judges alone: every later update is judged by the current one too.
                say(
                    f"gatekeeper: {update.ref}: new, at {update.new[:12]}, which {holder} already "
                    "holds (judged when it landed there); accepted"
                )
                continue
            targets = fork_targets(git_dir, update.new, tips)
            if not targets:
                problems.append(
                    f"{update.ref}: a new protected ref must fork from a protected ref, whose "
                    "policy and trust file judge it; "
                    + (
                        f"{update.new[:12]} shares no history with " + ", ".join(sorted(tips))
                        if tips
                        else "there is none here yet (protect the default branch, or create "
                        "the ref from one that is protected)"
                    )
                )
                continue
            say(
                f"gatekeeper: {update.ref}: new; judged against the protected ref(s) it forks "
                "from: " + ", ".join(name for name, _ in targets)
            )
        for base, rules, name, why in _judgements(git_dir, update, targets, patterns):
            if why:
                say(
                    f"gatekeeper: {update.ref}: judged also by the trust file and policy of "
                    f"{name} at {rules[:12]} ({why})"
                )
            result = judge(
                git_dir,
                base,
                update.new,
                target_name=name,
                head_name=update.new[:12],
                notes=sources,
                rules=rules,
            )
            explain(update.ref, result, say)
            blocked |= not result.passed
    for problem in problems:
        say(f"gatekeeper: {problem}")
    if blocked or problems:
        say("gatekeeper: push rejected; `gatekeeper check --format html -o report.html` shows why")
        return 1
    return 0


# --- client -----------------------------------------------------------------------------------


def local_protected(git_dir: Path, cwd: Path, remote: str = "origin") -> list[str]:
    """`gatekeeper.protect`, else the remote's default branch, else main/master."""
    patterns = configured_protect(git_dir, cwd=cwd)
    if patterns:
        return patterns
    out = git("symbolic-ref", "--quiet", f"refs/remotes/{remote}/HEAD", cwd=cwd, check=False)
    remote_head = out.decode("utf-8", "surrogateescape").strip()  # ref names are bytes
    if remote_head:
        return ["refs/heads/" + remote_head.removeprefix(f"refs/remotes/{remote}/")]
    configured = (
        git("config", "--get", "init.defaultBranch", cwd=cwd, check=False)
        .decode("utf-8", "surrogateescape")
        .strip()
    )
    return [f"refs/heads/{n}" for n in dict.fromkeys((configured or "main", "main", "master"))]


def _remote_protected_tips(git_dir: Path, remote: str, patterns: list[str]) -> dict[str, str]:
    """The remote-tracking copies of the remote's protected branches, and their commits."""
    prefix = f"refs/remotes/{remote}/"
    out = git("for-each-ref", "--format=%(objectname) %(refname)", prefix, git_dir=git_dir)
    tips = {}
    for line in out.decode("utf-8", "surrogateescape").splitlines():
        oid, _, name = line.partition(" ")
        branch = "refs/heads/" + name.removeprefix(prefix)
        if name != prefix + "HEAD" and is_protected(branch, patterns):
            tips[name] = oid
    return tips


def _remote_default(git_dir: Path, cwd: Path, remote: str) -> tuple[str, str] | None:
    """The remote-tracking copy of the remote's default branch, and its commit."""
    name = git("symbolic-ref", "--quiet", f"refs/remotes/{remote}/HEAD", cwd=cwd, check=False)
    ref = name.decode("utf-8", "surrogateescape").strip()
    oid = resolve_oid(git_dir, ref) if ref else None
    return (ref, oid) if oid else None


def _passes_current(
    git_dir: Path, cwd: Path, remote: str, ref: str, bases: list[str], head: str, say: Say
) -> bool:
    """As the server does: what a push adds must pass the remote default branch's rules too."""
    say = shown(say)
    current = _remote_default(git_dir, cwd, remote)
    if current is None or current[1] in bases:
        return True
    name, rules = current
    say(
        f"gatekeeper: {ref}: judged also by the trust file and policy of {name} at "
        f"{rules[:12]} (what {remote} trusts now)"
    )
    passed = True
    for base in bases:
        result = judge(git_dir, base, head, target_name=name, head_name=head[:12], rules=rules)
        explain(ref, result, say)
        passed &= result.passed
    return passed


def pre_push(git_dir: Path, cwd: Path, args: list[str], stdin: bytes, say: Say = _stderr) -> int:
    """The pusher's hook (see _pre_push), git's processor time bounded for the push."""
    with git_time(PUSH_LISTINGS):
        return _pre_push(git_dir, cwd, args, stdin, say)


def _pre_push(git_dir: Path, cwd: Path, args: list[str], stdin: bytes, say: Say = _stderr) -> int:
    """Judge each protected ref being pushed against what the remote has, with local receipts."""
    say = shown(say)
    remote = args[0] if args else "origin"
    lines = [line.split() for line in stdin.decode("utf-8", "replace").splitlines()]
    pushes = [p for p in lines if len(p) == 4]
    patterns = local_protected(git_dir, cwd, remote)
    pushes_notes = any(p[2] == NOTES_REF and p[1] != ZERO_OID for p in pushes)
    code = 0
    for local_ref, local_oid, remote_ref, remote_oid in pushes:
        if remote_ref == NOTES_REF or not is_protected(remote_ref, patterns):
            continue
        if local_oid == ZERO_OID:
            say(f"gatekeeper: {remote_ref}: deleting a protected branch; the server will refuse it")
            code = 1
            continue
        target: str | None = remote_oid
        if remote_oid == ZERO_OID:
            # As the server does: judged against the protected branch(es) it forks from.
            forks = fork_targets(
                git_dir, local_oid, _remote_protected_tips(git_dir, remote, patterns)
            )
            target = forks[0][1] if len(forks) == 1 else None
            if len(forks) > 1:
                for name, tip in forks:
                    result = judge(git_dir, tip, local_oid, target_name=name, head_name=local_ref)
                    explain(remote_ref, result, say)
                    code |= 0 if result.passed else 1
                bases = [tip for _, tip in forks]
                if not _passes_current(git_dir, cwd, remote, remote_ref, bases, local_oid, say):
                    code = 1
                continue
        elif not has_commit(git_dir, remote_oid):
            say(
                f"gatekeeper: {remote_ref}: the remote has {remote_oid[:12]}, which is not here; "
                f"run `git fetch {remote}` first"
            )
            code = 1
            continue
        if target is None:
            say(f"gatekeeper: {remote_ref}: nothing on {remote} to judge against; not checked")
            continue
        if remote_oid != ZERO_OID:
            rewound = rewind_problem(git_dir, remote_ref, remote_oid, local_oid)
            if rewound and not rewind_allowed(remote_ref, git_dir, cwd):
                say(f"gatekeeper: {rewound}; the server refuses it unless allowed there")
                code = 1
                continue
            if rewound and (
                problem := _rewound_rules_problem(
                    git_dir, RefUpdate(remote_oid, local_oid, remote_ref)
                )
            ):
                say(f"gatekeeper: {problem}; the server refuses it")
                code = 1
                continue
        result = judge(
            git_dir, target, local_oid, target_name=f"{remote}:{remote_ref}", head_name=local_ref
        )
        explain(remote_ref, result, say)
        if not _passes_current(git_dir, cwd, remote, remote_ref, [target], local_oid, say):
            code = 1
        if not result.passed:
            code = 1
        elif not pushes_notes:
            say(
                f"gatekeeper: hint: push {NOTES_REF} too, or the server finds no receipt "
                "(`gatekeeper init` configures `git push` to)"
            )
    return code


def merge_heads(git_dir: Path, cwd: Path, environ: dict[str, str]) -> list[str]:
    """The commits `git merge` is merging; it writes MERGE_HEAD only after this hook.

    git names them in GIT_REFLOG_ACTION (`merge <rev>...`); `git pull` merges FETCH_HEAD.
    """
    words = environ.get("GIT_REFLOG_ACTION", "").split()
    heads = []
    if words and words[0] == "merge":
        heads = [
            oid
            for w in words[1:]
            if (oid := resolve_oid(git_dir, w) if not w.startswith("-") else None)
        ]
    if not heads:
        fetch_head = _git_path(cwd, "FETCH_HEAD")
        if words and words[0] == "pull" and fetch_head.exists():
            heads = [
                line.split()[0]
                for line in fetch_head.read_text().splitlines()
                if line.strip() and "not-for-merge" not in line
            ]
    return heads


def pre_merge_commit(git_dir: Path, cwd: Path, environ: dict[str, str], say: Say = _stderr) -> int:
    """Before a merge commit on a protected branch, judge each branch being merged into it."""
    say = shown(say)
    branch = _protected_head(git_dir, cwd)
    if branch is None:
        return 0
    return _judge_merge(git_dir, cwd, branch, merge_heads(git_dir, cwd, environ), say)


def pre_commit_merge(git_dir: Path, cwd: Path, say: Say = _stderr) -> int:
    """Before a commit that completes a merge on a protected branch (`git commit` after a
    merge stopped: a conflict, or pre-merge-commit refused), judge each branch in MERGE_HEAD
    as pre-merge-commit does. Any other commit passes."""
    say = shown(say)
    merge_head = _git_path(cwd, "MERGE_HEAD")
    if not merge_head.is_file():
        return 0
    branch = _protected_head(git_dir, cwd)
    if branch is None:
        return 0
    heads = [w for w in merge_head.read_text().split() if w]
    return _judge_merge(git_dir, cwd, branch, heads, say)


def _git_path(cwd: Path, name: str) -> Path:
    out = git("rev-parse", "--path-format=absolute", "--git-path", name, cwd=cwd)
    return Path(out.decode("utf-8", "surrogateescape").strip())  # a path: bytes, not always UTF-8


def _protected_head(git_dir: Path, cwd: Path) -> str | None:
    """The branch checked out in cwd when it is a protected one, else None."""
    out = git("symbolic-ref", "--quiet", "HEAD", cwd=cwd, check=False)
    branch = out.decode("utf-8", "surrogateescape").strip()  # ref names are bytes
    if not branch or not is_protected(branch, local_protected(git_dir, cwd)):
        return None
    return branch


def _judge_merge(git_dir: Path, cwd: Path, branch: str, heads: list[str], say: Say) -> int:
    """Judge each of heads merged into branch (checked out in cwd); 0 when all pass."""
    say = shown(say)
    if not heads:
        say(
            f"gatekeeper: {branch}: cannot tell what is being merged, so it was not checked here; "
            "the server's pre-receive hook still checks the push"
        )
        return 0
    target = git("rev-parse", "HEAD", cwd=cwd).decode().strip()
    code = 0
    for head in heads:
        result = judge(git_dir, target, head, target_name=branch, head_name=head[:12])
        explain(branch, result, say)
        code |= 0 if result.passed else 1
        if not _passes_current(git_dir, cwd, "origin", branch, [target], head, say):
            code = 1
    if code:
        say(
            "gatekeeper: the merge is not committed; `git merge --abort` drops it (committing "
            "it with `git commit` is judged again, by the pre-commit hook)"
        )
    return code


# --- the pre-commit framework ------------------------------------------------------------------


def pre_commit_push(
    git_dir: Path, cwd: Path, environ: dict[str, str], every_branch: bool, say: Say = _stderr
) -> int:
    """The pre-push stage of the pre-commit framework, which passes one pushed ref in
    PRE_COMMIT_* variables instead of git's standard input.

    A protected ref is judged as the pre-push hook judges it; the remote's old value is its
    remote-tracking copy (the framework passes no old value for a rewound or new branch). With
    every_branch, any other branch is judged against the remote's default branch, as a pull
    request's check would judge it. Raises UsageError outside the framework.
    """
    say = shown(say)
    local_oid = environ.get("PRE_COMMIT_TO_REF", "")
    remote_ref = environ.get("PRE_COMMIT_REMOTE_BRANCH", "")
    if not local_oid or not remote_ref:
        raise UsageError(
            "PRE_COMMIT_TO_REF and PRE_COMMIT_REMOTE_BRANCH are not set: this entry is for the "
            "pre-commit framework's pre-push stage",
            hint="outside it, use `gatekeeper hooks install` (git's own pre-push) or "
            "`gatekeeper check`",
        )
    remote = environ.get("PRE_COMMIT_REMOTE_NAME") or "origin"
    local_ref = environ.get("PRE_COMMIT_LOCAL_BRANCH") or local_oid
    remote_ref = full_ref(remote_ref)
    tracking = f"refs/remotes/{remote}/{remote_ref.removeprefix('refs/heads/')}"
    remote_oid = resolve_oid(git_dir, tracking) or ZERO_OID
    if is_protected(remote_ref, local_protected(git_dir, cwd, remote)):
        line = f"{local_ref} {local_oid} {remote_ref} {remote_oid}\n"
        return pre_push(git_dir, cwd, [remote], line.encode(), say)
    if not every_branch:
        return 0
    default = _remote_default(git_dir, cwd, remote)
    if default is None:
        name = default_branch(git_dir)
        oid = resolve_oid(git_dir, name)
        if oid is None:
            say(f"gatekeeper: {remote_ref}: no default branch to judge against; not checked")
            return 0
        default = (name, oid)
    name, target = default
    result = judge(git_dir, target, local_oid, target_name=name, head_name=local_ref)
    explain(remote_ref, result, say)
    return 0 if result.passed else 1
