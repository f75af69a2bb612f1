"""`-q/--quiet` for the commands that create something: they print only the new
thing's identifier (lock token, slot ID, key secret, pool name) and nothing
else, so that `X=$(fencepost ... -q)` works in a shell script."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from fencepost.cli.common import CliFailure, Ctx
from fencepost.cli.exitcodes import ExitCode

F = TypeVar("F", bound=Callable[..., Any])


def quiet_option(identifier: str) -> Callable[[F], F]:
    """The `-q/--quiet` flag; `identifier` names what is printed (for --help)."""
    return click.option(
        "-q", "--quiet", is_flag=True,
        help=f"Print only {identifier} (for X=$(fencepost ...)); not with --json.",
    )


def check_output_mode(ctx: Ctx, quiet: bool) -> None:
    """--json and --quiet ask for two different outputs: refuse the pair before
    anything is sent, rather than silently pick one."""
    if quiet and ctx.as_json:
        raise CliFailure("choose one of --json and --quiet.", ExitCode.USAGE)


def emit_created(ctx: Ctx, quiet: bool, identifier: str, data: Any,
                 human: str | Callable[[], str]) -> None:
    """The identifier alone with --quiet, else what `Ctx.emit` prints."""
    if quiet:
        click.echo(identifier)
    else:
        ctx.emit(data, human)
