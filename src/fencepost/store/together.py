"""Like first statements of one batch sent as one statement (PostgreSQL).

In a batch run in steps (batch.py), every step operation sends its first
statement in one pipeline: one round trip, but still one statement each, and
a statement costs psycopg about 50 µs of this process's CPU and the database
about 30 µs more, which was most of what an acquire or a release cost beyond
the HTTP work. Operations whose first statement is `Together` (an acquire of
a free lock, a renewal, a release) instead have it gathered, and each kind goes out once
for all of them, with one array per parameter: measured, about 15 µs here and
15-20 µs in the database per operation.

Only operations whose keys no other operation of the batch has are gathered:
their statements then touch disjoint rows, so sending them together, after
the batch's other first statements, decides exactly what sending each in its
turn would. Anything else (a second operation on a key, a plain operation,
an isolated replay, the general case) sends its statements one by one, as
before. The gathered statements go out before the pipeline closes for a plain
operation, so nothing that runs in its turn can pass them.

A Together that `shares_keys` is written to decide several operations on one
key as sending them in turn would (a pool's admissions are numbered in order
and admitted up to the room the pool has: pools.py), so it gathers the
operations of a batch whatever keys they share. It still goes out after the
pipeline's other first statements: the operations of one batch are
concurrent (none was answered before the others were submitted), so any
order of them is one their callers could have seen, and an operation whose
first statement took no effect is decided by its general case after all of
them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from fencepost.store.batch import Cursor, Engine


def unnest(params: Sequence[tuple[str, str]]) -> str:
    """`x` for a `many` statement: one row per gathered operation, numbered
    `n`, of the (name, SQL type) `params`, each `?` taking one array."""
    arrays = ", ".join(f"?::{kind}[]" for _, kind in params)
    return f"unnest({arrays}) WITH ORDINALITY AS x({', '.join(n for n, _ in params)}, n)"


@dataclass(frozen=True, slots=True)
class Together:
    """A first statement that several operations of a batch may send as one.

    `single` is one operation's statement (`?` placeholders). `many` decides
    the same for several: each of its `?` takes the list of one parameter of
    `single`'s (the same place), with one value per operation in order, and
    each row it returns starts with the operation's place in that order
    (1-based, as `WITH ORDINALITY` numbers them), followed by the columns
    `single` returns. Both return a row for each operation they took effect
    for (RETURNING), and none for the others. `many` is PostgreSQL's SQL
    (arrays and unnest): only a batch run in steps gathers. Without `single`,
    `many` serves a lone operation too (its caller sends something else where
    nothing gathers). With `shares_keys`, operations that share a key gather
    too (see the module docstring)."""

    single: str | None
    many: str
    shares_keys: bool = False


class _Answer:
    """One operation's answer out of a gathered statement's (a Cursor): its
    row, or none when the statement took no effect for it."""

    __slots__ = ("_group", "_place", "_read")

    def __init__(self, group: _Group, place: int) -> None:
        self._group = group
        self._place = place
        self._read = False

    def _row(self) -> Any:
        return self._group.row(self._place)

    @property
    def rowcount(self) -> int:
        return 0 if self._row() is None else 1

    def fetchone(self) -> Any:
        if self._read:
            return None
        self._read = True
        return self._row()

    def fetchall(self) -> list[Any]:
        row = self.fetchone()
        return [] if row is None else [row]


class _Group:
    """The gathered operations of one Together, and its cursor once sent."""

    __slots__ = ("params", "_cursor", "_rows", "_single")

    def __init__(self) -> None:
        self.params: list[tuple[Any, ...]] = []
        self._cursor: Cursor | None = None
        self._rows: dict[int, tuple[Any, ...]] | None = None
        self._single = False

    def send(self, engine: Engine, conn: Any, together: Together) -> None:
        self._single = len(self.params) == 1 and together.single is not None
        if self._single:  # alone: its own statement, already prepared
            assert together.single is not None
            self._cursor = engine.execute(conn, together.single, self.params[0])
            return
        columns = tuple(list(values) for values in zip(*self.params, strict=True))
        self._cursor = engine.execute(conn, together.many, columns)

    def row(self, place: int) -> Any:
        assert self._cursor is not None, "read before the gathered statement was sent"
        if self._rows is None:
            rows = self._cursor.fetchall()
            if self._single:  # `single`'s rows carry no place
                self._rows = {1: tuple(rows[0])} if rows else {}
            else:
                self._rows = {int(row[0]): tuple(row[1:]) for row in rows}
        return self._rows.get(place)


class Gathering:
    """The Together statements of one batch's first statements, until sent."""

    __slots__ = ("_groups",)

    def __init__(self) -> None:
        self._groups: dict[Together, _Group] = {}

    def add(self, together: Together, params: tuple[Any, ...]) -> Cursor:
        group = self._groups.get(together)
        if group is None:
            group = self._groups[together] = _Group()
        group.params.append(params)
        return _Answer(group, len(group.params))

    def send(self, engine: Engine, conn: Any) -> None:
        """Send each gathered kind as one statement (in the open pipeline)."""
        groups, self._groups = self._groups, {}
        for together, group in groups.items():
            group.send(engine, conn, together)
