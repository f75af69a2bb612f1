"""`GET /ui` and `GET /ui/{asset}`: the web console, a page and a few static files
shipped in the package (no build step, nothing fetched from elsewhere). The page
talks to the JSON API with the key typed into it, so these routes need no key.

Only the file names in `ASSETS` are ever served (a fixed allowlist: no path from
the request reaches the file system), each read once and kept in memory, with a
strict Content-Security-Policy: only this origin's script, style and API."""

from __future__ import annotations

import functools
from importlib.resources import files

from fencepost.server.context import Call
from fencepost.server.messages import Response

PAGE = "index.html"
# The static files besides the page, by name, with their content types.
ASSETS = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # The files change only with the package; a browser may keep them briefly,
    # but must ask again soon after an upgrade.
    "Cache-Control": "no-cache",
}
SECURITY_HEADER_NAMES = ("Content-Security-Policy", "X-Content-Type-Options", "Referrer-Policy")


@functools.cache
def _read(name: str) -> bytes:
    return files("fencepost.server").joinpath("ui", name).read_bytes()


def _answer(name: str, media_type: str) -> Response:
    return Response(_read(name), media_type=media_type, headers=dict(SECURITY_HEADERS))


async def page(call: Call[None]) -> Response:
    return _answer(PAGE, "text/html; charset=utf-8")


async def asset(call: Call[None]) -> Response:
    name = call.params["asset"]  # one of ASSETS: the table's enum, checked by the app
    return _answer(name, ASSETS[name])
