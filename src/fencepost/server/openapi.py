"""The OpenAPI 3.1 document, generated from the route table and the msgspec schemas."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from fencepost import __version__
from fencepost.server import schemas
from fencepost.server.routes.table import ROUTES, RouteSpec

_REF = "#/components/schemas/{name}"
_UUID_HEADERS = {"X-Lock-Token", "X-Request-Id"}
_ERROR_STATUSES = {
    400: "invalid_request", 401: "unauthorized", 403: "forbidden", 413: "payload_too_large",
    422: "validation_error", 429: "quota_exceeded",
}


def build_openapi() -> bytes:
    types: list[Any] = [schemas.ErrorBody, schemas.NothingToRelease]
    for route in ROUTES:
        if route.body is not None:
            types.append(route.body)
        types.extend(t for _, t, _ in route.responses if t is not None)
    _, components = msgspec.json.schema_components(types, ref_template=_REF)
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route)
    document = {
        "openapi": "3.1.0",
        "info": {"title": "fencepost", "version": __version__,
                 "description": "Locks with fencing tokens, TTL leases and pools."},
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-Api-Key"},
            },
        },
        "paths": paths,
    }
    return msgspec.json.encode(document)


def _ref(t: type) -> dict[str, str]:
    return {"$ref": _REF.format(name=t.__name__)}


def _operation(route: RouteSpec) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": route.summary,
        "operationId": route.handler.__name__,
        "responses": {},
    }
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in re.findall(r"{(\w+)}", route.path)
    ]
    params += [
        {"name": name, "in": "header", "required": required, "description": text,
         "schema": {"type": "string", "format": "uuid"} if name in _UUID_HEADERS
         else {"type": "string"}}
        for name, required, text in route.headers
    ]
    params += [
        {"name": name, "in": "query", "required": False, "description": text,
         "schema": {"type": "string"}}
        for name, text in route.query
    ]
    if params:
        op["parameters"] = params
    if route.role is not None:
        op["security"] = [{"bearer": []}, {"apiKey": []}]
        op["description"] = f"Needs the {route.role.label} role."
    if route.body is not None:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(route.body)}},
        }
    for status, body_type, text in route.responses:
        response: dict[str, Any] = {"description": text}
        schema = _ref(body_type) if body_type is not None else _ref(schemas.ErrorBody)
        if route.path != "/openapi.json":
            response["content"] = {"application/json": {"schema": schema}}
        op["responses"][str(status)] = response
    if route.role is not None:
        for status, code in _ERROR_STATUSES.items():
            op["responses"].setdefault(
                str(status),
                {"description": code,
                 "content": {"application/json": {"schema": _ref(schemas.ErrorBody)}}},
            )
    return op
