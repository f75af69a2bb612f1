"""Where the commands that work on the store itself keep an admin key they
mint (the bootstrap key of `serve`, `project create`, `project admin-key
--new`): a file readable only by its owner, beside an SQLite store, in the
current folder for PostgreSQL. The secret is shown once; the file is how a
person who missed it (or a script that captured it and lost it) gets it back
on the machine that holds the store."""

from __future__ import annotations

import os
from pathlib import Path

from fencepost.store import sqlite_path

BOOTSTRAP_PROJECT = "default"


def admin_key_file(store_url: str, project: str = BOOTSTRAP_PROJECT) -> Path:
    """`fencepost.db.admin-key` for the bootstrap project, `fencepost.db.NAME.admin-key`
    for project NAME (project names hold no `/`); `fencepost[.NAME].admin-key` in
    the current folder for a PostgreSQL store."""
    middle = "" if project == BOOTSTRAP_PROJECT else f".{project}"
    if store_url.startswith("sqlite:"):
        return Path(f"{sqlite_path(store_url)}{middle}.admin-key")
    return Path(f"fencepost{middle}.admin-key")


def save_secret(path: Path, secret: str) -> None:
    """Write `secret` to `path`, readable and writable by this user only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secret + "\n")
    os.chmod(path, 0o600)  # also when the file already existed with wider modes
