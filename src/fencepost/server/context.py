"""What a handler gets: the app's services, and its request as the route table
checked it (the caller's key, the path names, the declared headers, the body)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from fencepost.events import Events
from fencepost.server.access_log import AccessLog, AcquireLog
from fencepost.server.auth import Authenticator, Principal
from fencepost.server.listing import list_turns
from fencepost.server.messages import Request
from fencepost.server.metrics import Metrics
from fencepost.server.upstream import Upstreams
from fencepost.server.waiting import WaitRoom
from fencepost.store.base import Store

B = TypeVar("B")


@dataclass(slots=True)
class Services:
    """Built once per app and shared by every request."""

    store: Store
    auth: Authenticator
    waiters: WaitRoom
    access_log: AccessLog
    events: Events
    metrics: Metrics
    openapi: bytes  # the document, encoded once
    metrics_key: str | None  # when set, GET /metrics needs `Bearer <it>`
    shutting_down: bool = False  # /readyz turns 503 at once on SIGTERM
    worker: int | None = None  # this process's number among `serve --workers N`'s
    # Proxy mode's HTTP client and --upstream-allow (SPEC §4.7).
    upstreams: Upstreams = field(default_factory=Upstreams)
    # Turns at building list answers, which are large (listing.LISTS_AT_ONCE).
    lists: asyncio.Semaphore = field(default_factory=list_turns)


class Call(Generic[B]):
    """One request after the checks its route declares: `caller` is the key
    (routes with a role), `params` the path and header parameters by name
    (headers in lower case), `body` the decoded body (None when the route takes
    none, or an optional one was empty), `log` the acquire's access-log line
    (routes that write one)."""

    __slots__ = ("request", "services", "params", "body", "log", "_caller")

    def __init__(
        self, request: Request, services: Services, caller: Principal | None,
        params: dict[str, str], body: B, log: AcquireLog | None,
    ) -> None:
        self.request = request
        self.services = services
        self._caller = caller
        self.params = params
        self.body = body
        self.log = log

    @property
    def caller(self) -> Principal:
        # Only a route with a role reads it, and the app authenticated those.
        assert self._caller is not None, "a route without a role has no caller"
        return self._caller

    @property
    def acquire_log(self) -> AcquireLog:
        assert self.log is not None, "the route table gives this route no access-log line"
        return self.log

    @property
    def request_id(self) -> str:
        return self.request.request_id
