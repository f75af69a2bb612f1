"""The naming rule for lock keys and pool names (SPEC §2)."""

from __future__ import annotations

import re

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
_NAME_RE = re.compile(NAME_PATTERN)


def is_valid_name(name: str) -> bool:
    # fullmatch, not match: with match, "$" would also accept a trailing newline.
    return _NAME_RE.fullmatch(name) is not None
