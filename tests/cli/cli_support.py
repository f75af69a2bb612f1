"""Helpers for the CLI's tests: run `python -m fencepost ...` as a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from support import ServerProcess


def cli_env(server: ServerProcess | None = None, key: str | None = None,
            **extra: str) -> dict[str, str]:
    """The test's environment without FENCEPOST_* variables, pointed at `server`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEPOST_")}
    if server is not None:
        env["FENCEPOST_URL"] = server.base_url
        env["FENCEPOST_API_KEY"] = key or server.admin_key
    env.update(extra)
    return env


def fp(*args: str, env: dict[str, str], timeout: float = 60,
       input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fencepost", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, input=input,
                          stdin=None if input is not None else subprocess.DEVNULL)


def fp_json(*args: str, env: dict[str, str], code: int = 0) -> Any:
    """Run with --json; assert the exit code and that stdout is one JSON document."""
    out = fp(*args, "--json", env=env)
    assert out.returncode == code, (out.returncode, out.stdout, out.stderr)
    return json.loads(out.stdout)


def assert_clean_failure(out: subprocess.CompletedProcess[str], code: int | None = None) -> None:
    """A failure: non-zero exit, a message on stderr, never a traceback."""
    assert out.returncode != 0, out
    if code is not None:
        assert out.returncode == code, (out.returncode, out.stdout, out.stderr)
    assert out.stderr.strip(), out
    assert "Traceback" not in out.stderr + out.stdout, out.stderr
