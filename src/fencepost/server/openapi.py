"""The OpenAPI 3.1 document, generated from the route table and the msgspec schemas.

Everything the server enforces is stated: body schemas come from the very Structs
the routes decode with (msgspec writes their bounds, enums and
`additionalProperties: false`), parameters from the table's constraints, and
every error a route can answer from the error classes it raises, each status
with the error body and the codes it may carry.
"""

from __future__ import annotations

from typing import Any

import msgspec

from fencepost import __version__
from fencepost.errors import (
    FencepostError,
    Forbidden,
    InvalidRequest,
    PayloadTooLarge,
    QuotaExceeded,
    StoreNotReplicated,
    StoreUnavailable,
    Unauthorized,
    ValidationError,
)
from fencepost.server import schemas
from fencepost.server.params import Param
from fencepost.server.routes import ui
from fencepost.server.routes.table import ROUTES, RouteSpec

_REF = "#/components/schemas/{name}"
_JSON = "application/json"

# Errors every route of a kind can answer, besides those the route raises itself.
_ANY_ROUTE = (InvalidRequest,)  # a malformed request or a repeated header, before routing
_AUTHENTICATED = (Unauthorized, Forbidden, QuotaExceeded, StoreUnavailable)
_WITH_BODY = (InvalidRequest, PayloadTooLarge, ValidationError)
# A change (any method but GET) on a server told --require-sync-replication.
_CHANGES = (StoreNotReplicated,)
# Where the error class's docstring says less than the document should.
_MEANINGS = {
    InvalidRequest: "the body is not JSON or repeats a key in one object, a required header "
                    "is missing or malformed, a header that must not repeat is repeated, or "
                    "the request is not valid HTTP/1.1.",
}
_TAGS = {"locks": "locks", "pools": "pools", "keys": "keys", "whoami": "keys"}
_RETRY_AFTER_CODES = {"lock_held", "quota_exceeded", "too_many_requests", "queue_timeout",
                      "too_many_sessions"}

_HEADERS: dict[str, dict[str, Any]] = {
    "X-Request-Id": {
        "description": "The caller's X-Request-Id when it is up to 128 printable ASCII "
                       "characters, else one the server made.",
        "required": True,
        "schema": {"type": "string", "minLength": 1, "maxLength": 128},
    },
    "Retry-After": {
        "description": "Whole seconds, rounded up, when the server knows when to retry.",
        "schema": {"type": "integer", "minimum": 1},
    },
    "X-Remaining-Slots": {
        "description": "Slots still free after this admission.",
        "required": True, "schema": {"type": "integer", "minimum": 0},
    },
    "X-Effective-Limit": {
        "description": "Slots the pool admits now (the learned limit when adaptive).",
        "required": True, "schema": {"type": "integer", "minimum": 0},
    },
    "X-Remaining-Cost": {
        "description": "Units of the pool's budget per minute not yet spent, after this "
                       "admission; only where the pool has a unit budget (SPEC §4.6).",
        "schema": {"type": "integer", "minimum": 0},
    },
    "X-Queued-Ms": {
        "description": "How long this acquire waited in line.",
        "required": True, "schema": {"type": "integer", "minimum": 0},
    },
    "Content-Security-Policy": {
        "description": "The console runs only this origin's script and style, and talks only "
                       "to this origin.",
        "required": True, "schema": {"const": ui.CONTENT_SECURITY_POLICY},
    },
    "X-Content-Type-Options": {
        "description": "Browsers take the content type as sent.",
        "required": True, "schema": {"const": "nosniff"},
    },
    "Referrer-Policy": {
        "description": "No page address leaves the console.",
        "required": True, "schema": {"const": "no-referrer"},
    },
}


def build_openapi() -> bytes:
    return msgspec.json.encode(openapi_document())


def openapi_document() -> dict[str, Any]:
    types: list[Any] = [schemas.ErrorBody]
    for route in ROUTES:
        if route.body is not None:
            types.append(route.body)
        for _, body, _ in route.responses:
            types.extend(body if isinstance(body, tuple) else [body])
    _, components = msgspec.json.schema_components(
        [t for t in types if t is not dict], ref_template=_REF
    )
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "fencepost",
            "version": __version__,
            "description": "Locks with fencing tokens, TTL leases and pools. Bodies are JSON "
                           "objects; a repeated key is 400 invalid_request, an unknown field "
                           "422 validation_error; a number with an integral value (60.0) is "
                           "an integer. Bodies over 64 KiB are 413.",
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "components": {
            "schemas": components,
            "headers": _HEADERS,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-Api-Key"},
            },
        },
        "paths": paths,
    }


def _ref(t: type) -> dict[str, str]:
    return {"$ref": _REF.format(name=t.__name__)}


def _schema(body: type | tuple[type, ...] | None) -> dict[str, Any]:
    if isinstance(body, tuple):
        return {"oneOf": [_ref(t) for t in body]}
    if body is dict:
        return {"type": "object"}
    assert body is not None
    return _ref(body)


def _parameter(param: Param) -> dict[str, Any]:
    return {"name": param.name, "in": param.where, "required": param.required,
            "description": param.description, "schema": param.schema}


def _header_refs(names: tuple[str, ...] | list[str]) -> dict[str, Any]:
    return {name: {"$ref": f"#/components/headers/{name}"} for name in names}


def _operation(route: RouteSpec) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": route.operation_id,
        "summary": route.summary,
        "tags": [_TAGS.get(route.path.split("/")[2 if route.path.startswith("/v1/") else 1],
                           "system")],
    }
    params = [*route.path_params, *route.params]
    if params:
        op["parameters"] = [_parameter(p) for p in params]
    if route.role is None:
        op["security"] = []
    else:
        op["security"] = [{"bearer": []}, {"apiKey": []}]
        op["description"] = f"Needs the {route.role.label} role (or a higher one)."
    if any(p.where == "query" for p in params):
        op["description"] = op.get("description", "") + " Unknown query parameters are 422."
    if route.passthrough and route.method not in ("GET", "DELETE", "OPTIONS"):
        op["requestBody"] = {
            "required": False,
            "description": "Sent on to the upstream as it comes (any media type), up to the "
                           "pool's max_body_bytes.",
            "content": {"*/*": {"schema": {}}},
        }
    if route.body is not None:
        op["requestBody"] = {
            "required": not route.body_optional,
            "description": "May be empty." if route.body_optional else "A JSON object.",
            "content": {_JSON: {"schema": _ref(route.body)}},
        }
    responses: dict[str, Any] = {}
    for status, body, text in route.responses:
        responses[str(status)] = {
            "description": text,
            "headers": _header_refs(["X-Request-Id", *route.response_headers]),
            "content": {"*/*": {"schema": {}}} if route.passthrough
            else _content(body, route.text_types),
        }
    for status, errors in sorted(_errors(route).items()):
        responses[str(status)] = _error_response(errors)
    op["responses"] = responses
    return op


def _content(body: Any, text_types: tuple[str, ...]) -> dict[str, Any]:
    if body is str:  # a web page, or the console's script and style sheet
        return {kind: {"schema": {"type": "string"}} for kind in text_types}
    if body is bytes:  # the metrics' text exposition
        return {"text/plain": {"schema": {"type": "string"}}}
    return {_JSON: {"schema": _schema(body)}}


def _errors(route: RouteSpec) -> dict[int, list[type[FencepostError]]]:
    """Every error the route can answer, by status, in a stable order."""
    kinds: list[type[FencepostError]] = [*_ANY_ROUTE, *route.errors]
    if route.role is not None:
        kinds += _AUTHENTICATED
        if route.method != "GET":
            kinds += _CHANGES
    if route.body is not None:
        kinds += _WITH_BODY
    kinds += [p.refused_with for p in (*route.path_params, *route.params) if p.refused_with]
    by_status: dict[int, list[type[FencepostError]]] = {}
    for kind in kinds:
        same = by_status.setdefault(kind.http_status, [])
        if kind not in same:
            same.append(kind)
    return by_status


def _error_response(errors: list[type[FencepostError]]) -> dict[str, Any]:
    codes = [kind.code for kind in errors]
    headers = ["X-Request-Id"]
    if _RETRY_AFTER_CODES & set(codes):
        headers.append("Retry-After")
    return {
        "description": " ".join(f"`{kind.code}`: {_meaning(kind)}" for kind in errors),
        "headers": _header_refs(headers),
        "content": {_JSON: {"schema": {
            "allOf": [
                _ref(schemas.ErrorBody),
                {"properties": {"error": {"properties": {"code": {"enum": codes}}}}},
            ],
        }}},
    }


def _meaning(kind: type[FencepostError]) -> str:
    """The error class's docstring without its leading "NNN: "."""
    if kind in _MEANINGS:
        return _MEANINGS[kind]
    text = " ".join((kind.__doc__ or kind.default_message).split())
    return text.split(": ", 1)[1] if text[:3].isdigit() else text
