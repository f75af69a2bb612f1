"""The route table is the authority: the app checks each route's role and body
as the served OpenAPI document states them (both are built from
server/routes/table.py). Every operation of the document is sent a key one role
too low (403 exactly where the document names a role) and a body with an
unknown field (422 exactly where the document has a request body)."""

from __future__ import annotations

import re
import uuid
from typing import Any

import httpx
import pytest

from fencepost.server.routes.table import ROUTES
from support import ServerProcess, unique_name

ROLES = ["reader", "member", "admin"]
WRONG_BODY = {"no_such_field": 1}
# A valid value for each path parameter the table uses (checked below to be all
# of them): each passes the parameter's own check, so that only the role or
# the body decides the answer.
PATH_VALUES = {
    "key": lambda: unique_name("walk"),
    "pool": lambda: unique_name("walk"),
    "slot_id": lambda: "slot_" + "A" * 20,
    "session_id": lambda: "ses_" + "A" * 32,
    "id": lambda: "no-such-key-id",
    "asset": lambda: "console.js",
    "path": lambda: "echo/v1",
}


@pytest.fixture(scope="module")
def doc(server: ServerProcess) -> dict[str, Any]:
    resp = httpx.get(f"{server.base_url}/openapi.json", timeout=30)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


@pytest.fixture(scope="module")
def keys(server: ServerProcess) -> dict[str, str]:
    made = {role: server.create_key(role)["key"] for role in ("reader", "member")}
    return {**made, "admin": server.admin_key}


def operations(doc: dict[str, Any]) -> dict[str, tuple[str, str, dict[str, Any]]]:
    return {
        op["operationId"]: (method.upper(), path, op)
        for path, item in doc["paths"].items()
        for method, op in item.items()
    }


def needed_role(op: dict[str, Any]) -> str | None:
    """The role the document says the operation needs (None: no key)."""
    if op["security"] == []:
        return None
    found = re.search(r"Needs the (\w+) role", op.get("description", ""))
    assert found is not None, op["operationId"]
    return found.group(1)


def error_codes(op: dict[str, Any], status: int) -> list[str]:
    response = op["responses"].get(str(status))
    if response is None:
        return []
    schema = response["content"]["application/json"]["schema"]["allOf"][1]
    return list(schema["properties"]["error"]["properties"]["code"]["enum"])


def send(server: ServerProcess, method: str, path: str, op: dict[str, Any],
         key: str | None, body: Any) -> httpx.Response:
    """The operation with valid path, header and query parameters."""
    url = path
    headers: dict[str, str] = {} if key is None else {"Authorization": f"Bearer {key}"}
    query: dict[str, str] = {}
    for param in op.get("parameters", []):
        name, where = param["name"], param["in"]
        if where == "path":
            url = url.replace("{" + name + "}", PATH_VALUES[name]())
        elif where == "header" and param["required"]:
            assert param["schema"].get("format") == "uuid", name
            headers[name] = str(uuid.uuid4())
        elif where == "query" and param["required"]:
            assert param["schema"]["type"] == "integer", name
            query[name] = str(param["schema"]["minimum"])
    return httpx.request(method, f"{server.base_url}{url}", headers=headers, params=query,
                         json=body, timeout=30)


def test_the_document_has_every_route_of_the_table(doc: dict[str, Any]) -> None:
    assert sorted(operations(doc)) == sorted(route.operation_id for route in ROUTES)
    used = {p.name for route in ROUTES for p in route.path_params}
    assert used == set(PATH_VALUES)


@pytest.mark.parametrize("operation_id", [route.operation_id for route in ROUTES])
def test_a_key_one_role_too_low_gets_403_where_the_document_names_a_role(
    server: ServerProcess, doc: dict[str, Any], keys: dict[str, str], operation_id: str,
) -> None:
    method, path, op = operations(doc)[operation_id]
    role = needed_role(op)
    if role is None:
        # No key at all is answered, never refused for want of one.
        assert "forbidden" not in error_codes(op, 403)
        resp = send(server, method, path, op, None, None)
        assert resp.status_code not in (401, 403), resp.text
        return
    assert "forbidden" in error_codes(op, 403)
    assert "unauthorized" in error_codes(op, 401)
    assert send(server, method, path, op, None, None).status_code == 401
    # The role is checked before the body: a wrong body changes nothing here.
    if ROLES.index(role) > 0:
        too_low = keys[ROLES[ROLES.index(role) - 1]]
        resp = send(server, method, path, op, too_low, WRONG_BODY)
        assert resp.status_code == 403, resp.text
        assert resp.json()["error"]["code"] == "forbidden"
    # ...and the role named is enough: the request gets past the key.
    resp = send(server, method, path, op, keys[role], None)
    assert resp.status_code not in (401, 403), resp.text


@pytest.mark.parametrize("operation_id", [route.operation_id for route in ROUTES])
def test_a_wrong_body_gets_422_exactly_where_the_document_has_a_body(
    server: ServerProcess, doc: dict[str, Any], keys: dict[str, str], operation_id: str,
) -> None:
    method, path, op = operations(doc)[operation_id]
    role = needed_role(op)
    key = None if role is None else keys[role]
    resp = send(server, method, path, op, key, WRONG_BODY)
    # Proxy mode's routes pass any body on unread (`*/*`): no JSON to refuse.
    if "application/json" in op.get("requestBody", {}).get("content", {}):
        assert "validation_error" in error_codes(op, 422)
        assert resp.status_code == 422, resp.text
        error = resp.json()["error"]
        assert error["code"] == "validation_error"
        assert any(d["field"] == "no_such_field" for d in error["details"]), error
    else:
        # A route without a body ignores one: whatever else it answers, the
        # body is not what decides it.
        assert resp.status_code != 422, resp.text
