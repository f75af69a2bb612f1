"""Static checks the design asks for: ruff-clean source, mypy-clean core/ and store/."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


@pytest.mark.skipif(shutil.which("ruff") is None and not (ROOT / ".venv/bin/ruff").exists(),
                    reason="ruff is installed by the test extras")
def test_ruff_is_clean() -> None:
    result = _run("ruff", "check", "src")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_clean_on_core_and_store() -> None:
    pytest.importorskip("mypy")
    result = _run("mypy", "src/fencepost/core", "src/fencepost/store", "src/fencepost/errors.py")
    assert result.returncode == 0, result.stdout + result.stderr
