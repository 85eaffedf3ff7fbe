"""Commits people signed: accounted for by their own git signature, not by a receipt.

A commit no receipt covers is a person's when git's own verification (`%G?` and friends) finds
a good signature by a key the target's trust file lists on a `person` line. Verification never
runs in the repository under review, whose configuration could name any gpg.program: each
commit object is copied into a throwaway repository (its id recomputed, so it is exactly the
object under review), and git runs there with no system or global configuration, no hooks, a
fresh HOME, every signing program forced by `-c` to the one found on this machine, an
allowed-signers file and an OpenPGP keyring built from the target's person keys alone.

A person's commit is then judged by the target's policy like any other change, its own diff
against its first parent: paths.write, `.git` segments and protected paths, which a person may
change without an explicit write entry only where `paths.protected_writers: person`.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gatekeeper.gate.coverage import VerifiedReceipt
from gatekeeper.gate.diffread import GIT_TIME
from gatekeeper.gate.findings import Finding, Kind
from gatekeeper.gate.history import CommitInfo
from gatekeeper.gate.policy_check import path_findings
from gatekeeper.git import SAFE_CONFIG, git
from gatekeeper.policy.model import LoadedPolicy
from gatekeeper.policy.patterns import has_git_segment
from gatekeeper.proc import CalledProcessError, TimedOut, cmd_output_within
from gatekeeper.receipt.changes import Change
from gatekeeper.receipt.trust import PersonKey, TrustFile, ssh_ed25519_blob, ssh_fingerprint

MAX_COMMIT_BYTES = 1 << 20  # a commit object larger than this is not checked
# Commit objects read for their signatures, in all: a push of a few KB can hold dozens of
# commits whose messages take megabytes each (a pack stores them compressed).
MAX_COMMIT_BYTES_IN_ALL = 64 << 20
# Signatures checked in one judgement: each costs a verifier's process (ssh-keygen, gpg); a
# push of under a megabyte could carry thousands of copies of one signature.
MAX_SIGNATURES_CHECKED = 500
# The time, on the clock, git and the verifiers it starts (one per signature) may take for the
# signatures of one judgement, or of all the judgements of one push in a hook; past it they
# are ended and none of those signatures counts.
MAX_VERIFY_SECONDS = 60
SSH_ARMOR = "-----BEGIN SSH SIGNATURE-----"
PGP_ARMOR = "-----BEGIN PGP SIGNATURE-----"
PGP_END = "-----END PGP SIGNATURE-----"
# How git tells a signature's format (gpg-interface.c): by the start of the header's text. An
# OpenPGP "message" is verified by gpg as well.
_FORMATS = (
    (SSH_ARMOR, "ssh"),
    (PGP_ARMOR, "openpgp"),
    ("-----BEGIN PGP MESSAGE-----", "openpgp"),
)
# What gpg is given of an OpenPGP signature: the signature packets git makes (one per key that
# signed, a few hundred bytes each) and nothing else. An armoured "signature" is any packets
# at all: a few kilobytes of nested compressed ones inflate to terabytes, which gpg parses
# for hours; no signature holds one.
MAX_OPENPGP_SIGNATURE_BYTES = 16 << 10
MAX_OPENPGP_SIGNATURES = 4
MAX_SIGNATURE_HEADER_BYTES = 64 << 10  # the whole header, armour headers and all
_ARMOR_HEADER = re.compile(r"[A-Za-z][A-Za-z0-9-]*: .*")
_BASE64_LINE = re.compile(r"[A-Za-z0-9+/]+=*")
# The armour's checksum, when there is one: `=` and exactly four base64 characters (gpg reads
# a longer line starting with `=` as more data).
_CHECKSUM = re.compile(r"=[A-Za-z0-9+/]{4}")
# The longest armour line read as written: RFC 4880 allows 76 characters of base64 a line (gpg
# and git write 64); an armour header is text. gpg cuts a line past 19,998 characters short
# and reads on from the next, so bytes a longer line hides from it would shift what it decodes.
MAX_DATA_LINE = 76
MAX_HEADER_LINE = 1000
# What git's %G? says, when the signature is not good.
RESULTS = {
    "B": "the signature does not match the commit (made over other content, or changed since)",
    "E": "the signature cannot be checked with the target's person keys",
    "X": "the signature has expired",
    "Y": "the signature was made by a key that has expired",
    "R": "the signature was made by a key that has been revoked",
    "N": "git finds no signature it can read",
}
# One record per commit: id, result, key fingerprint, primary key fingerprint, signer. (Not
# %GT: git 2.39 aborts on it for a signature by a key missing from the keyring.)
LOG_FORMAT = "%H%x00%G?%x00%GF%x00%GP%x00%GS%x00"


@dataclass(frozen=True)
class Check:
    """git's verdict on one commit's signature."""

    result: str
    fingerprint: str
    primary: str
    signer: str


@dataclass
class People:
    """Commits accounted for by a person's signature, and the findings on signed commits."""

    signed: dict[str, PersonKey] = field(default_factory=dict)  # commit -> its signer's key
    findings: list[Finding] = field(default_factory=list)
    rejected: set[str] = field(default_factory=set)  # signed, but not by a trusted person
    paths: set[str] = field(default_factory=set)  # every path the people's commits change

    @property
    def accounted(self) -> set[str]:
        """Signed commits: a person's, or one with an `untrusted-signature` finding of its own."""
        return set(self.signed) | self.rejected

    def labels(self) -> dict[str, str]:
        return {oid: key.label for oid, key in self.signed.items()}

    def reject(self, commit: CommitInfo, why: str) -> None:
        """commit's signature does not account for it: an `untrusted-signature` finding."""
        self.rejected.add(commit.oid)
        self.findings.append(
            Finding(
                Kind.untrusted_signature,
                f"commit {commit.short} ({commit.subject!r}) {why}",
                commit=commit.oid,
            )
        )


def signature_format(raw: bytes, object_format: str = "sha1") -> str | None:
    """The kind of a commit object's signature: ssh, openpgp or other; None when unsigned.

    The header is the one git verifies in a repository of that object format (`gpgsig` for
    SHA-1, `gpgsig-sha256` for SHA-256); a signature under the other name is no signature here.
    """
    headers = signature_headers(raw, object_format)
    if not headers:
        return None
    text = b"\n".join(headers).decode("utf-8", "replace")  # as git reads it: all, unstripped
    for prefix, form in _FORMATS:
        if text.startswith(prefix):
            return form
    return "other"


def signature_headers(raw: bytes, object_format: str = "sha1") -> list[bytes]:
    """Each signature header of a commit object's head, its lines joined as git joins them
    (the header's value, then each following line that starts with a space, less the space).
    git hands the verifier all of them together."""
    wanted = b"gpgsig" if object_format == "sha1" else b"gpgsig-" + object_format.encode()
    found: list[list[bytes]] = []
    inside = False
    for line in raw.split(b"\n\n", 1)[0].split(b"\n"):
        name, space, value = line.partition(b" ")
        if inside and line.startswith(b" "):
            found[-1].append(line[1:])
        elif name == wanted and space:
            found.append([value])
            inside = True
        else:
            inside = False
    return [b"\n".join(lines) for lines in found]


def openpgp_problem(raw: bytes, object_format: str = "sha1") -> str | None:
    """Why a commit's OpenPGP signature is not given to gpg, or None: it must be one header
    holding one armoured block of 1 to MAX_OPENPGP_SIGNATURES signature packets (tag 2, each
    of a length its header states), MAX_OPENPGP_SIGNATURE_BYTES at most."""
    headers = signature_headers(raw, object_format)
    if len(headers) != 1:
        return f"it has {len(headers)} signature headers, where git writes one"
    if len(headers[0]) > MAX_SIGNATURE_HEADER_BYTES:
        return f"its signature is over {MAX_SIGNATURE_HEADER_BYTES >> 10} KiB"
    try:  # (an armour header, a Comment say, may be UTF-8; the rest is ASCII, checked below)
        raw_lines = headers[0].decode("utf-8").split("\n")
    except UnicodeDecodeError:
        return "its signature holds bytes that are not UTF-8"
    if any(len(line) > MAX_HEADER_LINE for line in raw_lines):
        return f"its signature has a line of over {MAX_HEADER_LINE} characters"
    lines = [line.rstrip() for line in raw_lines]
    while lines and not lines[-1]:
        lines.pop()
    if len(lines) < 3 or lines[0] != PGP_ARMOR or lines[-1] != PGP_END:
        return "its signature is not one armoured OpenPGP signature block"
    body = lines[1:-1]
    if "" not in body:
        return "its armoured signature has no blank line before its data"
    blank = body.index("")
    if not all(_ARMOR_HEADER.fullmatch(h) for h in body[:blank]):
        return "its armoured signature has a malformed header line"
    data_lines = body[blank + 1 :]
    first_data = 1 + blank + 1  # (its index in raw_lines)
    if any(
        len(line) > MAX_DATA_LINE for line in raw_lines[first_data : first_data + len(data_lines)]
    ):
        return f"its armoured signature has a data line of over {MAX_DATA_LINE} characters"
    if data_lines and _CHECKSUM.fullmatch(data_lines[-1]):
        data_lines.pop()  # the checksum (gpg checks it)
    if not data_lines or not all(
        line.isascii() and _BASE64_LINE.fullmatch(line) for line in data_lines
    ):
        return "its armoured signature's data is not base64"
    encoded = "".join(data_lines)
    if len(encoded) > MAX_OPENPGP_SIGNATURE_BYTES * 4 // 3 + 4:
        return f"its signature is over {MAX_OPENPGP_SIGNATURE_BYTES >> 10} KiB"
    try:
        data = base64.b64decode(encoded, validate=True)
    except binascii.Error:
        return "its armoured signature's data is not base64"
    return _packets_problem(data)


def _packets_problem(data: bytes) -> str | None:
    """Why OpenPGP packets are not signature packets only (RFC 9580 4.2), or None."""
    at = count = 0
    while at < len(data):
        first = data[at]
        if not first & 0x80:
            return "its signature is not OpenPGP packets"
        if first & 0x40:  # the current packet format
            tag = first & 0x3F
            if at + 1 >= len(data):
                return "its signature's last packet is cut"
            octet = data[at + 1]
            if octet < 192:
                length, at = octet, at + 2
            elif octet < 224:
                if at + 2 >= len(data):
                    return "its signature's last packet is cut"
                length, at = ((octet - 192) << 8) + data[at + 2] + 192, at + 3
            elif octet == 255:
                length, at = int.from_bytes(data[at + 2 : at + 6], "big"), at + 6
            else:
                return "its signature has a packet of partial lengths, which no signature uses"
        else:  # the legacy format
            tag, kind = (first >> 2) & 0x0F, first & 0x03
            if kind == 3:
                return "its signature has a packet of no stated length, which no signature uses"
            size = 1 << kind
            length, at = int.from_bytes(data[at + 1 : at + 1 + size], "big"), at + 1 + size
        if tag != 2:
            return (
                f"its signature holds an OpenPGP packet of type {tag}, not only signature "
                "packets (a compressed packet, say, which gpg would inflate)"
            )
        count += 1
        at += length
        if at > len(data):
            return "its signature's last packet is cut"
    if not 1 <= count <= MAX_OPENPGP_SIGNATURES:
        return f"its signature holds {count} signature packets"
    return None


def read_commits(git_dir: Path, oids: list[str]) -> dict[str, bytes | None]:
    """The raw bytes of each commit object, read real: None when over MAX_COMMIT_BYTES, or
    past MAX_COMMIT_BYTES_IN_ALL with those before it."""
    if not oids:
        return {}
    checked = git(
        "cat-file", "--batch-check=%(objectname) %(objecttype) %(objectsize)",
        git_dir=git_dir, input="".join(f"{o}\n" for o in oids).encode(),
    ).decode()  # fmt: skip
    small = []
    total = 0
    for oid, line in zip(oids, checked.splitlines(), strict=True):
        name, kind, size = line.split(" ")
        if name != oid or kind != "commit":
            raise ValueError(f"{oid} is not a commit object ({line})")
        if int(size) <= MAX_COMMIT_BYTES and total + int(size) <= MAX_COMMIT_BYTES_IN_ALL:
            small.append(oid)
            total += int(size)
    out: dict[str, bytes | None] = dict.fromkeys(oids)
    if not small:
        return out
    data = git("cat-file", "--batch", git_dir=git_dir,
               input="".join(f"{o}\n" for o in small).encode())  # fmt: skip
    at = 0
    for oid in small:
        end = data.index(b"\n", at)
        name, _, size = data[at:end].decode().split(" ")
        if name != oid:
            raise ValueError(f"git cat-file answered {name} for {oid}")
        out[oid] = data[end + 1 : end + 1 + int(size)]
        at = end + 1 + int(size) + 1
    return out


def _program(name: str) -> str:
    # A path that cannot exist when the program is missing: git then cannot verify, and the
    # commit stays unaccounted for. Never a bare name that the environment could resolve.
    import shutil  # (loaded only to check a person's signature, as tempfile below)

    return shutil.which(name, path="/usr/local/bin:/usr/bin:/bin") or f"/nonexistent/{name}"


def _env(home: Path, gnupg: Path) -> dict[str, str]:
    """Nothing of the caller's environment but PATH: no GIT_*, no GNUPGHOME, no config."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "GNUPGHOME": str(gnupg),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_NO_REPLACE_OBJECTS": "1",
        "GIT_GRAFT_FILE": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "LC_ALL": "C",
        "TZ": "UTC",
    }


def _deadline() -> float:
    """When the verifiers must be done: MAX_VERIFY_SECONDS after the first of the judgement
    (or of the push, in a hook: the budget gate.diffread.git_time gives them) started."""
    budget = GIT_TIME.get()
    start = time.monotonic() + MAX_VERIFY_SECONDS
    if budget is None:
        return start
    with budget.lock:
        if budget.verify_deadline is None:
            budget.verify_deadline = start
        return budget.verify_deadline


class _Verifier:
    """A throwaway repository, keyring and allowed-signers file built from the trust file."""

    def __init__(self, root: Path, people: list[PersonKey], object_format: str) -> None:
        """Raises TimedOut past the verifiers' deadline (_deadline)."""
        self.deadline = _deadline()
        self.root = root
        self.home = root / "home"
        self.gnupg = root / "gnupg"
        self.home.mkdir(mode=0o700)
        self.gnupg.mkdir(mode=0o700)
        (root / "tmp").mkdir(mode=0o700)  # git's copies of signatures: gone with root
        # no-autostart: verifying needs no gpg-agent or dirmngr, and none outlives the check.
        (self.gnupg / "gpg.conf").write_text("no-autostart\nno-auto-key-retrieve\n")
        self.env = {**_env(self.home, self.gnupg), "TMPDIR": str(root / "tmp")}
        self.repo = root / "objects.git"
        self._run("git", "init", "-q", "--bare", "--template=", f"--object-format={object_format}",
                  str(self.repo))  # fmt: skip
        self.principals: dict[str, PersonKey] = {}
        lines = []
        for index, key in enumerate(people):
            if key.kind == "ssh":
                principal = f"person-{index}"
                self.principals[principal] = key
                lines.append(f'{principal} namespaces="git" {key.key_type} {key.data}\n')
        self.allowed = root / "allowed_signers"
        self.allowed.write_text("".join(lines))
        self.openpgp: dict[str, PersonKey] = {}
        for index, key in enumerate(people):
            if key.kind == "openpgp":
                path = root / f"person-{index}.gpg"
                path.write_bytes(key.raw)
                rc, _, _ = self._within(
                    _program("gpg"), "--batch", "--no-tty", "--quiet",
                    "--import-options", "import-minimal", "--import", str(path),
                )  # fmt: skip
                if rc == 0:
                    self.openpgp[key.fingerprint] = key

    def _within(self, *argv: str, input: bytes | None = None) -> tuple[int, bytes, bytes]:
        """Run argv (and all it starts) until this verifier's deadline; raise TimedOut."""
        seconds = self.deadline - time.monotonic()
        return cmd_output_within(*argv, seconds=seconds, env=self.env, input=input)

    def _run(self, *argv: str, input: bytes | None = None) -> bytes:
        rc, out, err = self._within(*argv, input=input)
        if rc != 0:
            raise CalledProcessError(argv, rc, out, err)
        return out

    def _git(self, *args: str, input: bytes | None = None) -> bytes:
        return self._run(
            "git",
            *SAFE_CONFIG,
            # Every program git could run to check a signature, and every file it reads for
            # it, named here: the throwaway repository has no config, and these win anyway.
            "-c", f"gpg.program={_program('gpg')}",
            "-c", f"gpg.openpgp.program={_program('gpg')}",
            "-c", f"gpg.ssh.program={_program('ssh-keygen')}",
            "-c", "gpg.x509.program=/nonexistent/gpgsm",
            "-c", f"gpg.ssh.allowedSignersFile={self.allowed}",
            "-c", f"gpg.ssh.revocationFile={os.devnull}",
            "-c", "gpg.minTrustLevel=undefined",
            f"--git-dir={self.repo}",
            *args,
            input=input,
        )  # fmt: skip

    def check(self, raw: dict[str, bytes]) -> dict[str, Check]:
        """git's verdict on each commit object; raise ValueError if an id does not match."""
        paths = []
        for index, (oid, data) in enumerate(raw.items()):
            path = self.root / f"commit-{index}"
            path.write_bytes(data)
            paths.append((oid, path))
        # --literally: store the object exactly as the repository holds it; its id, checked
        # below, is what proves the copy is the commit under review.
        written = self._git(
            "hash-object", "--literally", "-t", "commit", "-w", "--stdin-paths",
            input="".join(f"{p}\n" for _, p in paths).encode(),
        ).decode().split()  # fmt: skip
        if written != [oid for oid, _ in paths]:
            raise ValueError("a commit object copied for verification changed its id")
        out = self._git(
            "log", "--no-walk=unsorted", f"--format={LOG_FORMAT}", "--stdin",
            input="".join(f"{oid}\n" for oid in raw).encode(),
        )  # fmt: skip
        fields = out.split(b"\0")
        checks: dict[str, Check] = {}
        for start in range(0, len(fields) - 1, 5):
            oid, result, fpr, primary, signer = (
                f.decode("utf-8", "replace") for f in fields[start : start + 5]
            )
            checks[oid.strip()] = Check(result, fpr, primary, signer)
        if set(checks) != set(raw):
            raise ValueError("git log did not report every commit whose signature it checked")
        return checks

    def signer(self, form: str, check: Check) -> PersonKey | None:
        """The trusted person key behind a good signature, or None."""
        if form == "ssh" and check.result == "G":
            key = self.principals.get(check.signer)
            return key if key is not None and key.fingerprint == check.fingerprint else None
        if form == "openpgp" and check.result in ("G", "U"):
            # The keyring holds the person keys only; the primary key's fingerprint is the pin.
            return self.openpgp.get(check.primary.upper())
        return None


def _other_roles(trust: TrustFile) -> dict[str, str]:
    """SSH fingerprint of each receipt-signer and approver key -> its role and comment."""
    roles: dict[str, str] = {}
    for role, keys in (("a receipt signer", trust.signers), ("an approver", trust.approvers)):
        for key in keys:
            what = f"{role} ({key.comment})" if key.comment else role
            roles.setdefault(ssh_fingerprint(ssh_ed25519_blob(key.raw)), what)
    return roles


def _why(form: str, check: Check, trust: TrustFile) -> str:
    if form == "other":
        return "it is signed in a format other than SSH or OpenPGP, which person keys do not use"
    if check.result in ("G", "U") or (form == "ssh" and check.result == "E"):
        key = check.fingerprint or check.primary or "an unknown key"
        role = _other_roles(trust).get(check.fingerprint)
        if role is not None:
            return (
                f"it is signed by {key}, which the target's trust file lists as {role} only; "
                "only a `person` line accounts for a signed commit"
            )
        return f"it is signed by {key}, which the target's trust file does not list as a person"
    text = RESULTS.get(check.result, f"git reports {check.result!r}")
    if check.result == "E" and check.fingerprint:
        text += f" (key {check.fingerprint} is not a person key of the target's trust file)"
    return text


def person_findings(
    policy: LoadedPolicy, commit: CommitInfo, changes: list[Change]
) -> list[Finding]:
    """The target policy's findings on a person's commit (its own diff).

    Like any change, except that a protected path is the person's to change where the policy
    says `paths.protected_writers: person`; a `.git` segment never is.
    """
    findings = []
    for change in changes:
        for path in change.paths:
            for finding in path_findings(policy, path, commit.oid):
                if is_person_writable(policy, finding):
                    continue
                findings.append(finding)
    return findings


def is_person_writable(policy: LoadedPolicy, finding: Finding) -> bool:
    """True when finding is a protected path the policy lets people change."""
    return (
        finding.kind is Kind.protected_path
        and policy.policy.paths.protected_writers == "person"
        and finding.path is not None
        and not has_git_segment(finding.path)
    )


def object_format(git_dir: Path) -> str:
    out = git("rev-parse", "--show-object-format", git_dir=git_dir, check=False).decode().strip()
    return out or "sha1"


def joined_to_target(commits: list[CommitInfo]) -> set[str]:
    """The commits of a range (parents before children) whose history joins the target's.

    A commit joins when one of its parents is outside the range (so in the target's history)
    or joins itself. A root commit, and everything built only on roots of the range, belongs
    to another history: a person's signature there was made for another repository.
    """
    inside = {c.oid for c in commits}
    joined: set[str] = set()
    for commit in commits:
        if any(p not in inside or p in joined for p in commit.parents):
            joined.add(commit.oid)
    return joined


def account_for_people(
    git_dir: Path,
    commits: list[CommitInfo],
    trust: TrustFile | None,
    policy: LoadedPolicy | None,
    changes: Callable[[CommitInfo], list[Change]],
    *,
    joined: set[str],
) -> People:
    """Check the signature of each commit given (those no receipt covers).

    A good signature by a `person` key accounts for the commit, which is then judged by the
    policy, when the commit is in joined (joined_to_target of the whole range): a history
    that shares nothing with the target's (a person's other project, merged in) is not
    accounted for by the signatures on it. Any other signature is an `untrusted-signature`
    finding; unsigned commits are left as they are (uncovered). Raises GitError or ValueError
    only when git itself fails.
    """
    people = People()
    candidates = [c for c in commits if not c.is_merge]
    if trust is None or not candidates:
        return people
    raw = read_commits(git_dir, [c.oid for c in candidates])
    hash_name = object_format(git_dir)
    forms: dict[str, str] = {}
    for commit in candidates:
        data = raw[commit.oid]
        if data is None:
            people.reject(
                commit,
                f"is over {MAX_COMMIT_BYTES >> 20} MiB (or the commits read before it are over "
                f"{MAX_COMMIT_BYTES_IN_ALL >> 20} MiB together); its signature is not checked",
            )
            continue
        form = signature_format(data, hash_name)
        if form == "other":  # (nothing a person key verifies: no verifier is run on it)
            people.reject(commit, "is signed, but not by a person the target trusts: "
                          + _why(form, Check("N", "", "", ""), trust))  # fmt: skip
        elif form == "openpgp" and (problem := openpgp_problem(data, hash_name)):
            people.reject(commit, f"is signed, but not checked: {problem}")
        elif form is not None and len(forms) >= MAX_SIGNATURES_CHECKED:
            people.reject(
                commit,
                f"is signed, but more than {MAX_SIGNATURES_CHECKED} commits no receipt covers "
                "are signed in this range; its signature is not checked (land it in parts)",
            )
        elif form is not None:
            forms[commit.oid] = form
    if not forms:
        return people
    import tempfile  # (a check whose range holds no signed commit of a person never loads it)

    with tempfile.TemporaryDirectory(prefix="gatekeeper-signatures-") as tmp:
        try:
            verifier = _Verifier(Path(tmp), trust.people, hash_name)
            checks = verifier.check({oid: raw[oid] or b"" for oid in forms})
        except TimedOut:
            for commit in candidates:
                if commit.oid in forms:
                    people.reject(
                        commit,
                        f"is signed, but checking the signatures took over {MAX_VERIFY_SECONDS} s "
                        "(for this judgement, or in a hook for this push) and was ended; its "
                        "signature is not checked (land the range in parts)",
                    )
            return people
        for commit in candidates:
            form = forms.get(commit.oid)
            if form is None:
                continue
            check = checks[commit.oid]
            key = verifier.signer(form, check)
            if key is None:
                people.reject(
                    commit,
                    "is signed, but not by a person the target trusts: " + _why(form, check, trust),
                )
                continue
            if commit.oid not in joined:
                people.reject(
                    commit,
                    f"is signed by {key.label}, but it shares no history with the target: a "
                    "signature made for another repository does not account for a commit here",
                )
                continue
            people.signed[commit.oid] = key
            own = changes(commit)
            people.paths.update(p for change in own for p in change.paths)
            if policy is not None:
                people.findings.extend(person_findings(policy, commit, own))
    return people


def range_findings(
    policy: LoadedPolicy,
    found: list[Finding],
    people: People,
    receipts: list[VerifiedReceipt],
    already: list[Finding],
) -> list[Finding]:
    """The policy's findings on the range's net diff, less those the people account for.

    A protected path that only people's commits change (no receipt claims it) is theirs to
    change where the policy says `paths.protected_writers: person`; each such commit was judged
    on its own already. Findings already made (on a person's commit) are not repeated.
    """
    if not found:
        return []  # (and the receipts' 10,000 paths are not gathered for nothing)
    runs = {p for r in receipts for change in r.statement.predicate.changes for p in change.paths}
    kept = []
    for finding in found:
        if finding in already or finding in kept:
            continue
        if (
            finding.path in people.paths
            and finding.path not in runs
            and is_person_writable(policy, finding)
        ):
            continue
        kept.append(finding)
    return kept
