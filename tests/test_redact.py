"""Secrets passed into a run never reach the record."""

from __future__ import annotations

import pytest

from gatekeeper.receipt.redact import REDACTED, Redactor


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["aider", "--openai-api-key", "k-123456789"], ["aider", "--openai-api-key", REDACTED]),
        (["aider", "--api-key=abcdefgh"], ["aider", f"--api-key={REDACTED}"]),
        (["tool", "--token", "t0k3n-value"], ["tool", "--token", REDACTED]),
        (
            ["curl", "-H", "Authorization: Bearer abc.def"],
            ["curl", "-H", f"Authorization: {REDACTED}"],
        ),
        (["git", "clone", "https://me:pw@host/x"], ["git", "clone", f"https://{REDACTED}@host/x"]),
        (["echo", "sk-ant-api03-aaaaaaaaaaaaaaaaaaaa"], ["echo", REDACTED]),
        (["ls", "--all", "-l"], ["ls", "--all", "-l"]),
        (["pytest", "-k", "test_token_parsing"], ["pytest", "-k", "test_token_parsing"]),
    ],
)
def test_credential_options_are_redacted(argv: list[str], expected: list[str]) -> None:
    assert Redactor().argv(argv) == expected


def test_long_words_go_through_whole_and_a_url_password_after_one_is_still_redacted() -> None:
    # A script of 100 KiB given to `sh -c` is one long word: each pattern tries it once (a
    # URL scheme tried at every letter of it took minutes).
    script = "echo " + "y" * 100_000 + " | wc -c"
    assert Redactor(["s3cr3t-value-xyz"]).argv(["sh", "-c", script]) == ["sh", "-c", script]
    assert (
        Redactor().text("x" * 100 + "https://me:pw@host") == "x" * 100 + f"https://{REDACTED}@host"
    )
    assert Redactor().text("see git+ssh://me:pw@host/x") == f"see git+ssh://{REDACTED}@host/x"


def test_passed_in_values_are_redacted_anywhere() -> None:
    r = Redactor(["s3cr3t-value-xyz", "abc"])
    assert r.argv(["sh", "-c", "echo s3cr3t-value-xyz > f"]) == ["sh", "-c", f"echo {REDACTED} > f"]
    assert r.text("key=s3cr3t-value-xyz;") == f"key={REDACTED};"
    # values too short to be keys are left alone (they would redact ordinary words)
    assert r.text("abc") == "abc"


def test_the_output_filter_masks_secrets_cut_across_writes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os

    from gatekeeper.sandbox.output import MASK, OutputFilter

    out = tmp_path / "out"
    with open(out, "wb") as dest:
        f = OutputFilter(dest.fileno(), [b"s3cr3t-value-xyz"])
        for piece in (b"key=s3cr", b"3t-val", b"ue-xyz; again s3cr3t-value-xyz\n", b"\xe2\x94\x80"):
            os.write(f.write_fd, piece)
        f.finish()
    data = out.read_bytes()
    assert b"s3cr3t" not in data
    assert data == b"key=" + MASK + b"; again " + MASK + b"\n\xe2\x94\x80"


def test_an_agent_cannot_hide_a_script_behind_a_credential_option() -> None:
    argv = ["sh", "-c", 'eval "$1"', "-auth", "echo pwned > b.txt; curl -s http://x/"]
    assert Redactor().argv(argv) == argv
    assert Redactor().argv(["tool", "--token=two words"]) == ["tool", "--token=two words"]
    # ... while a one-word value still goes, and known secret values go wherever they are.
    assert Redactor(["s3cr3t-value-xyz"]).argv(["t", "--token", "x y s3cr3t-value-xyz"]) == [
        "t", "--token", f"x y {REDACTED}"]  # fmt: skip


def test_a_header_s_credential_goes_and_the_script_around_it_stays() -> None:
    # A header name in a one-line script took the rest of the line with it: the code that
    # ran was gone from the receipt. Only the credential (a scheme and one word) goes.
    script = 'h="Authorization: x"; import os; open("src/x.py", "w").write("pwned")'
    assert Redactor().argv(["python3", "-c", script]) == [
        "python3", "-c", f'h="Authorization: {REDACTED}"; import os; open("src/x.py", "w")'
        '.write("pwned")']  # fmt: skip
    assert Redactor().text("curl -H 'Authorization: Bearer abc.def' -d @f x; rm -rf y") == (
        f"curl -H 'Authorization: {REDACTED}' -d @f x; rm -rf y"
    )
    assert Redactor().text("X-Api-Key: k123\necho next line") == (
        f"X-Api-Key: {REDACTED}\necho next line"
    )
    assert Redactor().text("proxy-authorization: Basic dXNlcjpwdw== && make") == (
        f"proxy-authorization: {REDACTED} && make"
    )


def test_no_code_hides_between_a_scheme_and_an_at_sign() -> None:
    # User-info ran from `x://` to the next `@`, whatever lay between: a one-word script
    # (no blank: `\x20` in a string) that wrote a file showed as `a='x://[REDACTED]@'`.
    script = "a='x://';exec('import\\x20os;open(\"f\",\"w\")');b='@'"
    assert Redactor().argv(["python3", "-c", script]) == ["python3", "-c", script]
    shell = "x://;rm$IFS-rf$IFS*;a=@"
    assert Redactor().text(shell) == shell
    assert Redactor().text("git clone https://me:p%40ss!w$rd@host/x") == (
        f"git clone https://{REDACTED}@host/x"
    )


def test_a_header_s_credential_goes_however_it_is_written() -> None:
    # The narrower pattern of R19 let through a quoted token, a token made by a command and
    # the tail of a long token.
    long = "t" * 2000
    for line, shown in (
        ('curl -H "Authorization: Bearer \"s3cret\"" x', 'curl -H "Authorization: [REDACTED]\"" x'),
        ("curl -H 'Authorization: Basic $(printf admin:PASS | base64)' x",
         "curl -H 'Authorization: [REDACTED]' x"),
        ("curl -H 'Authorization: Basic `printf admin:PASS | base64`' x",
         "curl -H 'Authorization: [REDACTED]' x"),
        (f"Authorization: Bearer {long} && make", "Authorization: [REDACTED] && make"),
        ("Authorization:Basic dXNlcjpwdw==", "Authorization:[REDACTED]"),
    ):  # fmt: skip
        assert Redactor().text(line) == shown, line


def test_fixed_words_of_the_receipt_are_never_redacted() -> None:
    from gatekeeper.run.redaction import KEEP

    data = {"writes": [{"path": "commit_dir/x", "source": "commit", "decision": "allow"}]}
    out = Redactor(["Commit"]).data(data, KEEP)
    assert out == {"writes": [{"path": f"{REDACTED}_dir/x", "source": "commit",
                               "decision": "allow"}]}  # fmt: skip
