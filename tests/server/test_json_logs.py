"""Application messages are JSON lines (fencepost.logs): one whole object per
record, a traceback inside it as one string, libraries' warnings too."""

from __future__ import annotations

import io
import json
import logging
import warnings
from typing import Iterator

import pytest

from fencepost.logs import configure


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    out = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, logging.getLogger("fencepost").level)
    configure(out)
    yield out
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    logging.getLogger("fencepost").setLevel(saved[2])
    logging.captureWarnings(False)


def test_every_record_is_one_json_line(stream: io.StringIO) -> None:
    logging.getLogger("fencepost.test").info("serving on %s", "http://x")
    try:
        raise ValueError("line one\nline two")
    except ValueError:
        logging.getLogger("fencepost.test").exception("it failed")
    logging.getLogger("asyncio").error("a library's error")
    logging.getLogger("some.library").info("below warning: dropped")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("careful", UserWarning, stacklevel=1)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["message"].split(":")[0] for line in lines[:3]] == [
        "serving on http", "it failed", "a library's error"]
    assert all(line["log"] == "app" and line["ts"].endswith("Z") for line in lines)
    assert lines[1]["level"] == "error"
    assert "ValueError: line one\nline two" in lines[1]["traceback"]
    assert not any("dropped" in line["message"] for line in lines)
    assert lines[-1]["logger"] == "py.warnings" and "careful" in lines[-1]["message"]
