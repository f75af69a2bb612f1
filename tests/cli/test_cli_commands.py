"""The command table: every command is there, and each loads only what it
needs (`serve` starts without the HTTP client the API commands use)."""

from __future__ import annotations

import subprocess
import sys

import click

from fencepost.cli import main

COMMANDS = ["key", "lock", "pool", "project", "run", "serve", "whoami"]


def _loaded_after(args: list[str]) -> set[str]:
    """The modules a fresh interpreter has loaded after `fencepost ARGS`."""
    probe = (
        "import sys\n"
        "from fencepost.cli import main\n"
        f"main({args!r}, standalone_mode=False)\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=True)
    return set(done.stdout.split())


def test_serve_loads_no_http_client() -> None:
    loaded = _loaded_after(["serve", "--help"])
    assert "fencepost.cli.server" in loaded
    assert "httpx" not in loaded and "fencepost.client" not in loaded


def test_an_api_command_loads_the_client() -> None:
    assert "fencepost.client" in _loaded_after(["lock", "--help"])


def test_help_lists_every_command_and_each_one_loads() -> None:
    done = subprocess.run([sys.executable, "-m", "fencepost", "--help"], capture_output=True,
                          text=True, timeout=60, check=True)
    listed = [line.split()[0] for line in done.stdout.split("Commands:")[1].splitlines()
              if line.strip()]
    assert listed == COMMANDS
    for name in COMMANDS:
        assert main.get_command(click.Context(main), name) is not None, name


def test_an_unknown_command_is_a_usage_error() -> None:
    done = subprocess.run([sys.executable, "-m", "fencepost", "serv"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert "No such command 'serv'" in done.stderr
