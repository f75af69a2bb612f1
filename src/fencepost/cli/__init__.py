"""The `fencepost` command.

API commands (`lock`, `pool`, `key`, `whoami`, `run`) go through the Python
client; `serve` and `project` work on the server and store directly.
The CLI holds no rules of its own: it parses, calls, prints, and exits with a
code scripts can branch on (`fencepost.cli.exitcodes`).
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
from typing import Any

import click

# Each command and the module that defines it, imported only when the command
# runs (or help lists it): `serve` then loads no HTTP client, which the API
# commands need and which took a quarter of a second of every server's start.
_COMMANDS = {
    "serve": "fencepost.cli.server",
    "project": "fencepost.cli.projects",
    "lock": "fencepost.cli.locks",
    "pool": "fencepost.cli.pools",
    "key": "fencepost.cli.keys",
    "whoami": "fencepost.cli.keys",
    "run": "fencepost.cli.run",
}


class _Main(click.Group):
    """The root group: commands loaded when used (click's lazy subcommands);
    an unexpected failure is one line, not a traceback (set FENCEPOST_DEBUG=1
    to see the traceback)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = _COMMANDS.get(cmd_name)
        if module is None:
            return None
        if cmd_name == "serve":
            # A running server reopens its logs on SIGHUP (server/runner.py);
            # until it runs, logrotate's SIGHUP must not end it (SPEC §6). Set
            # before the server's modules load, the longest part of its start.
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
        command = getattr(importlib.import_module(module), cmd_name)
        assert isinstance(command, click.Command)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except KeyboardInterrupt:
            click.echo("fencepost: interrupted", err=True)
            sys.exit(130)
        except Exception as exc:  # noqa: BLE001 - the last line of defence
            if os.environ.get("FENCEPOST_DEBUG"):
                raise
            click.echo(f"fencepost: unexpected error: {type(exc).__name__}: {exc} "
                       "(set FENCEPOST_DEBUG=1 for details)", err=True)
            sys.exit(1)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="fencepost")
def main() -> None:
    """fencepost: locks with fencing tokens, TTL leases and pools.

    Client commands read FENCEPOST_URL and FENCEPOST_API_KEY (or --url,
    --api-key). Exit codes: 0 ok, 1 other error, 2 bad usage or input, 3 busy
    (lock held, no slot, over quota), 4 lease lost or expired, 5 not found,
    6 key refused, 7 server unreachable or failing.
    """


__all__ = ["main"]
