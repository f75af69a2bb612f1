"""`fencepost project`: commands that work on the store directly, not through
the API, so that they need no key: creating a project, and the way back for a
project whose every admin key is lost. Whoever can open the store can do both,
which is why they run on the store's own machine (or with its URL)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NoReturn, TypeVar

import click

from fencepost.cli.key_files import admin_key_file, save_secret
from fencepost.cli.stores import DEFAULT_STORE, store_exists
from fencepost.core.names import is_valid_name
from fencepost.errors import FencepostError
from fencepost.store import make_store, redacted
from fencepost.store.base import Store

T = TypeVar("T")

_store_option = click.option("--store", envvar="FENCEPOST_STORE", default=DEFAULT_STORE,
                             show_default=True)
_key_file_option = click.option(
    "--key-file", type=click.Path(dir_okay=False, path_type=Path),
    help="Save the key here (default: beside an SQLite store, NAME in its file name; "
         "the current folder for PostgreSQL).")


@click.group()
def project() -> None:
    """Manage projects directly in the store."""


@project.command("create")
@click.argument("name")
@_store_option
@click.option("--create", "create_store", is_flag=True,
              help="Make the store if it does not exist yet (a new SQLite file, or "
                   "fencepost's tables in an existing PostgreSQL database).")
@_key_file_option
def project_create(name: str, store: str, create_store: bool, key_file: Path | None) -> None:
    """Create project NAME and print its first admin key alone on stdout.

    The key is also saved to a file only this user can read (its path goes to
    stderr). The store must exist already (made by `fencepost serve` or by an
    earlier `--create`): a key written to a store that no server runs on would
    never be accepted, so a mistyped --store is refused rather than made.
    """
    _check_name(name)
    backend = _open(store)
    if not create_store and not _exists(store):
        _fail(f"no fencepost store at {redacted(store)} yet; check --store, or pass "
              "--create to make a new one (and serve it)")
    secret = _run(backend, lambda: backend.create_project(name))
    _hand_out(secret, key_file or admin_key_file(store, name), f"created project {name!r}")


@project.command("admin-key")
@click.argument("name")
@_store_option
@click.option("--new", "mint", is_flag=True,
              help="Mint a new admin key for the project and print it alone on stdout.")
@_key_file_option
def project_admin_key(name: str, store: str, mint: bool, key_file: Path | None) -> None:
    """The way back to project NAME when its admin keys are lost.

    Without --new, says where the key saved by `project create` (or the
    bootstrap) is. With --new, mints another admin key straight in the store,
    named "recovered admin", prints it alone on stdout and saves it like
    `project create`. The old keys keep working: once in, list them
    (`fencepost key list`) and revoke or retire the ones that are lost.
    """
    _check_name(name)
    path = key_file or admin_key_file(store, name)
    if not mint:
        if path.exists():
            click.echo(str(path.resolve()))
            click.echo(f"fencepost: the admin key saved for project {name!r} is in that file; "
                       "if it no longer works, pass --new to mint another", err=True)
            return
        _fail(f"no admin key saved for project {name!r} at {path}; pass --new to mint "
              "another (on the store's machine, or with its --store URL)")
    backend = _open(store)
    if not _exists(store):
        _fail(f"no fencepost store at {redacted(store)}; check --store")
    _record, secret = _run(backend, lambda: backend.recover_admin_key(name))
    _hand_out(secret, path, f"minted a new admin key for project {name!r}")


def _check_name(name: str) -> None:
    if not is_valid_name(name):
        raise click.UsageError(
            f"{name!r} is not a valid project name (letters, digits, . _ : -; up to 128)."
        )


def _open(store: str) -> Store:
    try:
        return make_store(store)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _exists(store: str) -> bool:
    try:
        return store_exists(store)
    except FencepostError as exc:
        _fail(exc.message)


def _run(backend: Store, work: Callable[[], Awaitable[T]]) -> T:
    async def opened() -> T:
        await backend.open()
        try:
            return await work()
        finally:
            await backend.close()

    try:
        return asyncio.run(opened())
    except FencepostError as exc:
        _fail(exc.message)


def _hand_out(secret: str, path: Path, done: str) -> None:
    """The secret alone on stdout (`KEY=$(fencepost project create acme)`),
    and saved; where, or why not, on stderr. A file that cannot be written
    does not fail the command: the key exists, and stdout has it."""
    click.echo(secret)
    try:
        save_secret(path, secret)
    except OSError as exc:
        click.echo(f"fencepost: {done}; could not save its admin key to {path} "
                   f"({exc.strerror}): keep the one printed", err=True)
        return
    click.echo(f"fencepost: {done}; its admin key is also saved to {path.resolve()} "
               "(readable by this user only)", err=True)


def _fail(message: str) -> NoReturn:
    click.echo(f"fencepost: {' '.join(message.split())}", err=True)
    raise SystemExit(1)
