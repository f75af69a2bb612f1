"""Bad input to the CLI: a clear message and a non-zero exit, never a traceback."""

from __future__ import annotations

import pytest

from cli_support import assert_clean_failure, cli_env, fp
from support import ServerProcess

BAD = [
    (["lock", "acquire", "bad/key"], "not a valid name"),
    (["lock", "acquire", "-starts-with-dash"], ""),
    (["lock", "acquire", "k" * 200], "not a valid name"),
    (["lock", "acquire", "k", "--ttl", "2"], "--ttl"),
    (["lock", "acquire", "k", "--ttl", "soon"], "--ttl"),
    (["lock", "acquire", "k", "--wait", "-1"], "--wait"),
    (["lock", "acquire", "k", "--wait", "nan"], "--wait"),
    (["pool", "acquire", "p", "--wait", "nan"], "--wait"),
    (["run", "--lock", "k", "--grace", "nan", "--", "true"], "--grace"),
    (["whoami", "--timeout", "nan"], "--timeout"),
    (["whoami", "--timeout", "inf"], "--timeout"),
    (["lock", "acquire", "k", "--metadata", "{bad json"], "not valid JSON"),
    (["lock", "acquire", "k", "--metadata", "[1, 2]"], "JSON object"),
    (["lock", "acquire", "k", "--on-expiry", "never"], "--on-expiry"),
    (["lock", "acquire", "k", "--token", "not-a-uuid"], "not a UUID"),
    (["lock", "renew", "k"], "--token"),
    (["lock", "show"], "KEY"),
    (["lock", "list", "--limit", "0"], "--limit"),
    (["lock", "explode"], "No such command"),
    (["pool", "set", "p"], "--limit"),
    (["pool", "set", "p", "--limit", "0"], "--limit"),
    (["pool", "release", "p", "slot_x", "--header", "no-colon"], "Name: value"),
    (["pool", "release", "p", "slot_x", "--status", "99"], "--status"),
    (["key", "create"], "--role"),
    (["key", "create", "--role", "root"], "--role"),
    (["run", "--lock", "k"], "COMMAND"),
    (["run", "--", "true"], "exactly one of --lock"),
    (["run", "--lock", "k", "--pool", "p", "--", "true"], "exactly one of --lock"),
    (["run", "--lock", "bad key", "--", "true"], "not a valid name"),
    (["whoami", "--url", "ftp://example.com"], "--url"),
    (["whoami", "--url", "::::"], "--url"),
    (["whoami", "--timeout", "0"], "--timeout"),
    (["nonsense"], "No such command"),
]


@pytest.mark.parametrize("args,needle", BAD, ids=[" ".join(a)[:40] for a, _ in BAD])
def test_bad_input_is_explained(server: ServerProcess, args: list[str], needle: str) -> None:
    out = fp(*args, env=cli_env(server))
    assert_clean_failure(out, 2)
    assert needle in out.stderr


def test_missing_api_key_is_explained() -> None:
    out = fp("whoami", env=cli_env(FENCEPOST_URL="http://127.0.0.1:1"))
    assert_clean_failure(out, 2)
    assert "FENCEPOST_API_KEY" in out.stderr


def test_validation_errors_name_the_field(server: ServerProcess) -> None:
    out = fp("pool", "set", "p-bad", "--limit", "5", "--term-ms", "10", env=cli_env(server))
    assert_clean_failure(out, 2)
    assert "term_ms" in out.stderr


def test_help_works_everywhere(server: ServerProcess) -> None:
    for args in (["--help"], ["lock", "--help"], ["lock", "acquire", "--help"],
                 ["pool", "--help"], ["key", "--help"], ["run", "--help"], ["whoami", "-h"]):
        out = fp(*args, env=cli_env(server))
        assert out.returncode == 0 and "Usage:" in out.stdout, args
