"""Rows read by name.

Each kind of row a statement returns is a NamedTuple whose fields are the
table's column names, in order: the statement selects `columns(TheRow)`, and
the code reads `TheRow._make(row)` by field. Adding a column is adding a field
(the SELECT list follows). A NamedTuple is a tuple built in C from the
driver's row: no dict per row, and the drivers keep their cheapest row type.
Rows of one or two columns are unpacked by name instead (`(ticket,) = row`).
"""

from __future__ import annotations

from typing import NamedTuple

# A NamedTuple class: the shape of a row.
Shape = type[NamedTuple]


def columns(shape: Shape, alias: str = "") -> str:
    """The SELECT list of `shape`'s columns, each `alias.`-qualified if given."""
    prefix = f"{alias}." if alias else ""
    return ", ".join(prefix + name for name in shape._fields)


def width(shape: Shape) -> int:
    """How many columns `shape` reads: where the columns that follow it start."""
    return len(shape._fields)


# The name of the caller that holds or waits: an API key's name, or the name a
# caller from an identity provider last gave (SPEC §5.1, table identities).
HOLDER_NAME = "COALESCE(k.name, i.name)"


def names_of(alias: str) -> str:
    """The joins HOLDER_NAME reads, for a row `alias` with key_id and project."""
    return (f"LEFT JOIN api_keys k ON k.id = {alias}.key_id "
            f"LEFT JOIN identities i ON i.project = {alias}.project AND i.id = {alias}.key_id")
