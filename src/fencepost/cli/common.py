"""What every API command shares: connection options, `--json`, running the
async client, and turning failures into one clear line and an exit code."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import click

from fencepost.cli.exitcodes import ExitCode, exit_code_for
from fencepost.cli.params import Seconds
from fencepost.client import AsyncClient
from fencepost.client.transport import DEFAULT_URL, OnRenewed, check_url
from fencepost.errors import FencepostError, LockHeld, UnexpectedResponse

P = ParamSpec("P")
T = TypeVar("T")


class CliFailure(Exception):
    """A failure the command already explained; carries its exit code."""

    def __init__(self, message: str, code: ExitCode) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


@dataclass(slots=True)
class Ctx:
    """A command's connection settings and output mode."""

    url: str
    api_key: str | None
    timeout: float
    as_json: bool
    # A JWT from the caller's identity provider (SPEC §5.1), read again as it expires.
    token_file: str | None = None
    token_command: str | None = None

    def client(self, *, need_key: bool = True, timeout: float | None = None,
               on_renewed: OnRenewed | None = None) -> AsyncClient:
        """A client with these settings; `timeout` lowers the per-request
        timeout, `on_renewed` is told of every lease renewal that got through."""
        if self.token_file and self.token_command:
            raise CliFailure("give --token-file or --token-command, not both.", ExitCode.USAGE)
        if need_key and not (self.api_key or self.token_file or self.token_command):
            raise CliFailure(
                "no API key: pass --api-key or set FENCEPOST_API_KEY (or a token from your "
                "identity provider: --token-file or --token-command).", ExitCode.USAGE
            )
        chosen = self.timeout if timeout is None else min(self.timeout, timeout)
        return AsyncClient(self.url, self.api_key, timeout=chosen, on_renewed=on_renewed,
                           token_file=self.token_file, token_command=self.token_command)

    def emit(self, data: Any, human: str | Callable[[], str]) -> None:
        """Print `data` as JSON with `--json`, else the human text."""
        if self.as_json:
            click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))
        else:
            click.echo(human() if callable(human) else human)

    def note(self, text: str) -> None:
        """A remark for people on stderr (never mixed into `--json` output)."""
        click.echo(text, err=True)


def connection_options(command: Callable[P, T]) -> Callable[P, T]:
    """`--url`, `--api-key`, `--timeout`, `--json` (each API command has them)."""
    decorators = [
        click.option("--url", envvar="FENCEPOST_URL", default=DEFAULT_URL, show_default=True,
                     metavar="URL", help="Server URL [env FENCEPOST_URL]."),
        click.option("--api-key", envvar="FENCEPOST_API_KEY", default=None, metavar="KEY",
                     help="API key [env FENCEPOST_API_KEY; prefer the variable: "
                          "arguments are visible to other local users]."),
        click.option("--token-file", envvar="FENCEPOST_TOKEN_FILE", default=None, metavar="PATH",
                     help="A file holding a JWT from your identity provider, sent as the "
                          "bearer and read again when it expires; with --api-key, the key "
                          "acts for the token's user [env FENCEPOST_TOKEN_FILE]."),
        click.option("--token-command", envvar="FENCEPOST_TOKEN_COMMAND", default=None,
                     metavar="COMMAND",
                     help="A command that prints such a JWT, run again when it expires "
                          "[env FENCEPOST_TOKEN_COMMAND]."),
        click.option("--timeout", type=Seconds(min=0.1, max=3600), default=10.0,
                     show_default=True, metavar="SECONDS", help="Per-request timeout."),
        click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts."),
    ]
    for decorate in reversed(decorators):
        command = decorate(command)
    return command


def api_command(fn: Callable[..., Awaitable[int | None]]) -> Callable[..., None]:
    """Turn `async def fn(ctx, **params) -> exit code | None` into a click callback
    that runs it, explains any failure in one line and exits with its code."""

    @functools.wraps(fn)
    def callback(url: str, api_key: str | None, timeout: float, as_json: bool,
                 token_file: str | None, token_command: str | None, **params: Any) -> None:
        try:
            check_url(url.strip())
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--url") from None
        ctx = Ctx(url.strip(), api_key, timeout, as_json, token_file or None,
                  token_command or None)
        sys.exit(run_async(ctx, fn(ctx, **params)))

    return callback


def run_async(ctx: Ctx, work: Awaitable[int | None]) -> int:
    """Run a command's coroutine; failures become a message and an exit code."""

    async def guarded() -> int:
        try:
            return int(await work or 0)
        except FencepostError as error:
            report_error(ctx, error)
            return int(exit_code_for(error))
        except CliFailure as failure:
            if ctx.as_json:
                click.echo(json.dumps({"error": {"code": "cli", "message": failure.message}}))
            click.echo(f"fencepost: {failure.message}", err=True)
            return int(failure.code)

    try:
        return asyncio.run(guarded())
    except KeyboardInterrupt:
        click.echo("fencepost: interrupted", err=True)
        return 130


def report_error(ctx: Ctx, error: FencepostError) -> None:
    """One line saying what went wrong, plus details that help fix it."""
    if ctx.as_json:
        body = error.to_body()
        if error.request_id:
            body["error"]["request_id"] = error.request_id
        click.echo(json.dumps(body, sort_keys=True, default=str))
    click.echo(f"fencepost: {describe_error(error)}", err=True)


def describe_error(error: FencepostError) -> str:
    lines = [error.message]
    details = error.extra.get("details")
    if isinstance(details, list):
        for item in details:
            if isinstance(item, dict):
                lines.append(f"  {item.get('field')}: {item.get('message')}")
    if isinstance(error, LockHeld):
        from fencepost.cli.render import duration

        parts = []
        if error.operation and error.operation not in error.message:
            parts.append(f"holder's operation: {error.operation}")
        expires_in_ms = error.extra.get("expires_in_ms")
        if isinstance(expires_in_ms, int):
            parts.append(f"expires in {duration(expires_in_ms / 1000)}" if expires_in_ms >= 0
                         else f"overdue by {duration(-expires_in_ms / 1000)}")
        if parts:
            lines[0] += f" ({'; '.join(parts)})"
    if isinstance(error, UnexpectedResponse) or error.http_status >= 500:
        if error.request_id:
            lines.append(f"  request id: {error.request_id}")
    return "\n".join(lines)


def stdin_is_terminal() -> bool:
    try:
        return os.isatty(sys.stdin.fileno())
    except (AttributeError, ValueError, OSError):
        return False


def stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


async def follow_pages(
    fetch: Callable[[str | None, int], Awaitable[tuple[list[T], str | None]]], limit: int
) -> tuple[list[T], str | None]:
    """Up to `limit` items of a paged list route, following `next` cursors;
    returns them and the cursor after the last (None at the end)."""
    items: list[T] = []
    after: str | None = None
    while len(items) < limit:
        page, after = await fetch(after, min(1000, limit - len(items)))
        items.extend(page)
        if after is None:
            break
    return items, after
