"""What every route needs, built once per app and reached through `services(request)`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Awaitable, Callable

from fencepost.core.names import is_valid_name
from fencepost.errors import FencepostError
from fencepost.events import Events
from fencepost.server.access_log import AccessLog
from fencepost.server.auth import Authenticator
from fencepost.server.http import error_response
from fencepost.server.messages import Request, Response
from fencepost.server.validation import invalid_field
from fencepost.server.waiting import WaitRoom
from fencepost.store.base import Store


@dataclass(slots=True)
class Services:
    store: Store
    auth: Authenticator
    waiters: WaitRoom
    access_log: AccessLog
    events: Events


def services(request: Request) -> Services:
    return request.app.services  # type: ignore[no-any-return]


def request_id(request: Request) -> str:
    return request.request_id


def path_name(request: Request, param: str) -> str:
    """A lock key or pool name from the path; breaking the naming rule is a 422."""
    name = str(request.path_params[param])
    if not is_valid_name(name):
        raise invalid_field(
            param, "must match ^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
        )
    return name


Handler = Callable[[Request], Awaitable[Response]]


def endpoint(handler: Handler) -> Handler:
    """Turn every FencepostError a handler raises into its JSON envelope."""

    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except FencepostError as error:
            return error_response(error)

    wrapped.__name__ = handler.__name__
    wrapped.__doc__ = handler.__doc__
    return wrapped
