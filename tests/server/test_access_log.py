"""The access log gathers lines and writes them once per event-loop turn."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from fencepost.server.access_log import AccessLog


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_without_a_loop_a_line_is_written_at_once(tmp_path: Path) -> None:
    path = tmp_path / "access.log"
    log = AccessLog(str(path))
    log.write("lock.acquire", outcome="granted", status=201)
    assert [line["event"] for line in lines(path)] == ["lock.acquire"]
    log.close()


async def test_lines_reach_the_file_one_loop_turn_later_in_order(tmp_path: Path) -> None:
    path = tmp_path / "access.log"
    log = AccessLog(str(path))
    for n in range(5):
        log.write("lock.acquire", n=n)
    assert path.read_text() == ""  # gathered, not yet written
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert [line["n"] for line in lines(path)] == [0, 1, 2, 3, 4]
    log.write("lock.force_release", n=5)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert [line["n"] for line in lines(path)] == [0, 1, 2, 3, 4, 5]
    log.close()


async def test_close_writes_what_is_pending(tmp_path: Path) -> None:
    path = tmp_path / "access.log"
    log = AccessLog(str(path))
    log.write("lock.acquire", n=1)
    log.close()
    assert [line["n"] for line in lines(path)] == [1]


def test_every_line_has_a_utc_timestamp(tmp_path: Path) -> None:
    path = tmp_path / "access.log"
    log = AccessLog(str(path))
    log.write("lock.acquire")
    log.close()
    (line,) = lines(path)
    assert isinstance(line["ts"], str) and line["ts"].endswith("Z")
