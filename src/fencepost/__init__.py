"""fencepost: a lock and lease service with fencing tokens.

`fencepost.Client` / `fencepost.AsyncClient` are the Python client (imported on
first use, so the server does not load it); every error is a
`fencepost.errors.FencepostError` subclass, the same classes the server uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from fencepost.client import AsyncClient, Client, Outcome, Retries, Upstream

__all__ = ["AsyncClient", "Client", "Outcome", "Retries", "Upstream", "__version__"]


def __getattr__(name: str) -> Any:
    if name in {"AsyncClient", "Client", "Outcome", "Retries", "Upstream"}:
        from fencepost import client

        return getattr(client, name)
    raise AttributeError(f"module 'fencepost' has no attribute {name!r}")
