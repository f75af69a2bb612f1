"""The documentation site builds with warnings as errors, its generated
references cover every route and command, the server serves the API reference
at /docs with nothing fetched from elsewhere, and no page carries tracker
numbers or commit hashes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import httpx
import pytest

from doc_examples import ROOT, pages
from support import ServerProcess


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # Material's notice, not a warning
    )
    assert built.returncode == 0, built.stdout + built.stderr
    return out


def _openapi_paths() -> list[str]:
    from fencepost.server.openapi import build_openapi

    return list(json.loads(build_openapi())["paths"])


def test_site_builds_strict_with_the_chart(site: Path) -> None:
    assert (site / "index.html").exists()
    assert (site / "img" / "adaptive-latest.png").read_bytes() == (
        ROOT / "bench" / "results" / "adaptive-latest.png").read_bytes()
    assert 'src="../img/adaptive-latest.png"' in (site / "concepts" / "index.html").read_text()


def test_http_reference_covers_every_route_and_schema(site: Path) -> None:
    page = (site / "http-api" / "index.html").read_text()
    assert "generated: http-api-reference" not in page
    for path in _openapi_paths():
        assert f"<code>{path}</code>" in page, path
    assert 'id="schema-acquirelockbody"' in page
    assert "ttl_seconds" in page and "7776000" in page


def test_cli_reference_is_every_command_help(site: Path) -> None:
    from fencepost.cli import main

    page = (site / "cli-reference" / "index.html").read_text()
    assert "generated: cli-reference" not in page
    context = click.Context(main)
    assert main.list_commands(context) == sorted(
        ["serve", "project", "lock", "pool", "key", "whoami", "run"])
    for group in ("lock", "pool", "key"):
        command = main.get_command(context, group)
        assert hasattr(command, "commands")
        for name, sub in command.commands.items():
            # A hidden command is an old name kept working, deliberately not shown.
            assert (f"fencepost {group} {name}" in page) != sub.hidden, (group, name)
    assert "--quiet" in page and "--busy-exit-code" in page


def test_the_server_serves_the_reference_at_docs_without_outside_assets(
        server: ServerProcess) -> None:
    answer = httpx.get(f"{server.base_url}/docs", timeout=10)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/html")
    page = answer.text
    for path in _openapi_paths():
        assert f"<code>{path}</code>" in page, path
    assert "<script" not in page and "<link" not in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page), "assets must be inline"
    assert "<style>" in page and "font:" in page  # the packaged style sheet, inlined


# Words a reader cannot use: tracker numbers, commit hashes, diary notes.
_FORBIDDEN = [
    (re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE), "an issue number"),
    (re.compile(r"(?<![\w/&])#\d+\b"), "a tracker number"),
    (re.compile(r"\bcommit\s+[0-9a-f]{6,}", re.IGNORECASE), "a commit hash"),
    (re.compile(r"(?<![\w-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])"),
     "something that looks like a commit hash"),
    (re.compile(r"\btargets?\s*\(", re.IGNORECASE), "a targets note"),
]


def test_no_tracker_numbers_commit_hashes_or_diary_in_the_docs() -> None:
    found = []
    for path in pages():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for pattern, what in _FORBIDDEN:
                if pattern.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {what}: {line.strip()}")
    assert not found, "\n".join(found)


def test_readme_is_short_and_its_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "pip install fencepost" not in readme  # not published: install from a clone
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if "://" not in link]
    assert local, "the README links into docs/"
    for link in local:
        assert (ROOT / link).exists(), link


def test_license_is_the_apache_text_pyproject_names() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert 'license = "Apache-2.0"' in (ROOT / "pyproject.toml").read_text()
