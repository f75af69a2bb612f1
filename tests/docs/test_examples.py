"""Every `sh` and `python` example of the README and docs/ runs against a real
server, page by page, in order; and the recipes' failure paths (no slot free,
upstream unreachable) release what they took and print no traceback."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from doc_examples import (
    DEFAULT_URL,
    Block,
    assigned_names,
    blocks,
    file_block,
    page_name,
    pages,
)
from docs_support import FirstStartServer, Upstream, example_env
from support import free_port

STATE = ".docs-shell-state"
SECOND_PORT = "7441"  # the port docs/operations.md starts a second server on
RECIPES = "docs/recipes.md"
# Reference pages: the others each show something a reader runs.
PAGES_WITHOUT_EXAMPLES = {"docs/architecture.md", "docs/benchmarks.md", "docs/cli-reference.md",
                          "docs/decisions.md"}


def _run_shell(block: Block, workdir: Path, env: dict[str, str], carried: list[str]) -> str:
    """One `sh` block under `set -eu` (so a failing line fails the example),
    with the variables earlier blocks of the page set."""
    save = " ".join(carried)
    script = (
        "set -euo pipefail\n"
        f"[ -f {STATE} ] && . ./{STATE}\n"
        f"{block.text}\n"
        f"for v in {save}; do declare -p \"$v\" 2>/dev/null || true; done > {STATE}\n"
    )
    path = workdir / f"block-{block.line}.sh"
    path.write_text(script)
    out = subprocess.run(["bash", str(path)], cwd=workdir, env=env, capture_output=True,
                         text=True, timeout=90, stdin=subprocess.DEVNULL)
    return _checked(block, out)


def _run_python(block: Block, workdir: Path, env: dict[str, str]) -> str:
    path = workdir / f"block-{block.line}.py"
    path.write_text(block.text)
    out = subprocess.run([sys.executable, str(path)], cwd=workdir, env=env,
                         capture_output=True, text=True, timeout=90,
                         stdin=subprocess.DEVNULL)
    return _checked(block, out)


def _checked(block: Block, out: subprocess.CompletedProcess[str]) -> str:
    report = f"example at {block.where} ({block.language})\n{block.text}\n" \
             f"exit {out.returncode}\nstdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    assert out.returncode == 0, report
    assert "Traceback" not in out.stdout + out.stderr, report
    return out.stdout


def _localised(block: Block, server: FirstStartServer) -> Block:
    """The docs show the default address; the test server has its own port (and
    the page that starts a second server gets a free port for it)."""
    text = block.text.replace(DEFAULT_URL, server.base_url)
    text = text.replace(SECOND_PORT, str(free_port()))
    return Block(block.page, block.line, block.language, text, block.directive, block.argument)


@pytest.mark.parametrize("page", [page_name(p) for p in pages()])
def test_every_example_of_the_page_runs(page: str, tmp_path: Path, upstream: Upstream) -> None:
    root = Path(__file__).resolve().parents[2]
    page_blocks = blocks(root / page)
    if not any(b.runs or b.directive == "file" for b in page_blocks):
        assert page in PAGES_WITHOUT_EXAMPLES, f"{page} has no example that runs"
        return
    server = FirstStartServer(tmp_path).start()
    try:
        _run_page(page_blocks, server, upstream)
    finally:
        server.stop()


def _run_page(page_blocks: list[Block], server: FirstStartServer, upstream: Upstream) -> None:
    env = example_env(server, upstream.url)
    workdir = server.workdir
    carried: list[str] = []
    for block in page_blocks:
        block = _localised(block, server)
        if block.directive == "file":
            target = workdir / block.argument
            target.write_text(block.text)
            target.chmod(0o755)
        elif block.runs and block.language == "sh":
            carried = sorted(set(carried) | set(assigned_names(block.text)))
            _run_shell(block, workdir, env, carried)
        elif block.runs:
            _run_python(block, workdir, env)


def test_every_page_parses_and_skips_say_why() -> None:
    skipped = []
    for path in pages():
        for block in blocks(path):  # raises on untagged blocks, bash tags, stray directives
            if block.directive == "skip":
                assert len(block.argument.split()) >= 3, f"{block.where}: say why it is skipped"
                skipped.append(block)
    # A few only: crontab lines, the scripts that start a server or the suite,
    # what needs other machines, a certificate, a container engine, or a
    # benchmark's quarter of an hour.
    assert len(skipped) <= 10, [b.where for b in skipped]


# The recipe for a rate-limited API, on its failure paths.

def _pool(server: FirstStartServer, name: str) -> dict[str, object]:
    with server.client() as http:
        answer = http.get(f"/v1/pools/{name}")
        assert answer.status_code == 200, answer.text
        return dict(answer.json())


def _set_pool(server: FirstStartServer, name: str, limit: int, queue_size: int) -> None:
    """A new pool (deleting it first ends its slots and clears its statistics)."""
    with server.client() as http:
        http.delete(f"/v1/pools/{name}")
        answer = http.put(f"/v1/pools/{name}", json={"limit": limit, "queue_size": queue_size})
        assert answer.status_code in (200, 201), answer.text


def _recipe(server: FirstStartServer, file_name: str) -> list[str]:
    block = _localised(file_block(RECIPES, file_name), server)
    path = server.workdir / file_name
    path.write_text(block.text)
    path.chmod(0o755)
    return ["sh", str(path)] if file_name.endswith(".sh") else [sys.executable, str(path)]


RECIPE_FILES = ["guarded-call.sh", "guarded_call.py"]


@pytest.fixture(scope="module")
def recipe_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FirstStartServer]:
    """One server for the recipe's failure paths: each test starts from a new pool."""
    server = FirstStartServer(tmp_path_factory.mktemp("recipes")).start()
    yield server
    server.stop()


@pytest.mark.parametrize("file_name", RECIPE_FILES)
def test_recipe_releases_its_slot_when_the_upstream_cannot_be_reached(
        file_name: str, recipe_server: FirstStartServer, upstream: Upstream) -> None:
    command = _recipe(recipe_server, file_name)
    _set_pool(recipe_server, "upstream-api", limit=2, queue_size=10)
    env = example_env(recipe_server, f"http://127.0.0.1:{free_port()}")  # nobody listens
    out = subprocess.run(command, cwd=recipe_server.workdir, env=env, capture_output=True,
                         text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == 75, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stdout + out.stderr, out.stderr
    assert "unreachable" in out.stderr, out.stderr
    pool = _pool(recipe_server, "upstream-api")
    assert pool["in_use"] == 0, pool  # released at once, not left to lapse after a term
    stats = pool["stats"]
    assert isinstance(stats, dict) and stats["released"] == 1, stats


@pytest.mark.parametrize("file_name", RECIPE_FILES)
def test_recipe_says_no_slot_free_without_a_traceback(
        file_name: str, recipe_server: FirstStartServer, upstream: Upstream) -> None:
    command = _recipe(recipe_server, file_name)
    _set_pool(recipe_server, "upstream-api", limit=1, queue_size=0)  # no waiting: fail fast
    with recipe_server.client() as http:
        taken = http.post("/v1/pools/upstream-api/lock/acquire", json={})
        assert taken.status_code == 200, taken.text
    env = example_env(recipe_server, upstream.url)
    calls = upstream.calls
    out = subprocess.run(command, cwd=recipe_server.workdir, env=env, capture_output=True,
                         text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == 75, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stdout + out.stderr, out.stderr
    assert out.stderr.strip(), "say why"
    assert upstream.calls == calls  # the upstream was never called without a slot
    assert _pool(recipe_server, "upstream-api")["in_use"] == 1  # only the slot taken above


@pytest.mark.parametrize("file_name", RECIPE_FILES)
def test_recipe_reports_the_upstream_status_with_the_release(
        file_name: str, recipe_server: FirstStartServer, upstream: Upstream) -> None:
    command = _recipe(recipe_server, file_name)
    _set_pool(recipe_server, "upstream-api", limit=2, queue_size=10)
    env = example_env(recipe_server, upstream.url)
    upstream.status = 429
    try:
        out = subprocess.run(command, cwd=recipe_server.workdir, env=env, capture_output=True,
                             text=True, timeout=60, stdin=subprocess.DEVNULL)
    finally:
        upstream.status = 200
    assert "Traceback" not in out.stdout + out.stderr, out.stderr
    pool = _pool(recipe_server, "upstream-api")
    assert pool["in_use"] == 0, pool
    stats = pool["stats"]
    assert isinstance(stats, dict), stats
    assert stats["statuses"]["4xx"] == 1 and stats["status_429"] == 1, stats

