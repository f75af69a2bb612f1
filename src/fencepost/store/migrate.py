"""Schema migrations with yoyo: one folder of SQL files per backend."""

from __future__ import annotations

from importlib import resources


def migrations_dir(backend: str) -> str:
    return str(resources.files("fencepost.store").joinpath("migrations", backend))


def apply_migrations(url: str, backend: str) -> None:
    """Bring the schema up to date; yoyo's lock serialises servers starting at once."""
    from yoyo import get_backend, read_migrations

    migrator = get_backend(url)
    try:
        with migrator.lock():
            migrator.apply_migrations(migrator.to_apply(read_migrations(migrations_dir(backend))))
    finally:
        migrator.connection.close()
