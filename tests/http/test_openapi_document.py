"""GET /openapi.json (SPEC §2, §6): valid OpenAPI 3.1 as outside tools judge it, and it
states the constraints the server enforces. tests/http/test_openapi_fuzz.py checks the
server's answers against it."""

from __future__ import annotations

from typing import Any, Iterator

import httpx
import jsonschema
import pytest
from openapi_spec_validator import validate
from openapi_spec_validator.validation import OpenAPIV31SpecValidator

from fencepost.core.names import NAME_PATTERN
from fencepost.server import schemas
from support import ServerProcess, lock_headers, new_token, unique_name

METHODS = {"get", "put", "post", "patch", "delete"}


@pytest.fixture(scope="module")
def doc(server: ServerProcess) -> dict[str, Any]:
    resp = httpx.get(f"{server.base_url}/openapi.json", timeout=30)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    return dict(resp.json())


def operations(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method in METHODS:
                yield method.upper(), path, op


def operation(doc: dict[str, Any], operation_id: str) -> dict[str, Any]:
    found = [op for _, _, op in operations(doc) if op["operationId"] == operation_id]
    assert len(found) == 1, operation_id
    return found[0]


def resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        node: Any = doc
        for part in schema["$ref"].removeprefix("#/").split("/"):
            node = node[part]
        schema = node
    return schema


def param(op: dict[str, Any], name: str) -> dict[str, Any]:
    found = [p for p in op.get("parameters", []) if p["name"] == name]
    assert len(found) == 1, (op["operationId"], name)
    return dict(found[0])


def test_the_served_document_is_valid_openapi_3_1(doc: dict[str, Any]) -> None:
    assert doc["openapi"].startswith("3.1.")
    errors = [str(e).splitlines()[0] for e in OpenAPIV31SpecValidator(doc).iter_errors()]
    assert errors == []
    validate(doc)  # the validator's own choice of version agrees


def test_every_operation_id_is_unique_and_says_what_it_does(doc: dict[str, Any]) -> None:
    ids = [op["operationId"] for _, _, op in operations(doc)]
    assert len(ids) == len(set(ids)), sorted(ids)
    assert {"acquireLock", "renewLease", "releaseLease", "acquireSlot", "renewSlot",
            "releaseSlot", "forceReleaseLock"} <= set(ids)


@pytest.mark.parametrize("operation_id, name", [
    ("acquireLock", "key"), ("renewLease", "key"), ("releaseLease", "key"), ("getLock", "key"),
    ("forceReleaseLock", "key"), ("putPool", "pool"), ("getPool", "pool"),
    ("deletePool", "pool"), ("acquireSlot", "pool"), ("renewSlot", "pool"),
    ("releaseSlot", "pool"),
])
def test_names_in_paths_carry_the_naming_rule(doc: dict[str, Any], operation_id: str,
                                              name: str) -> None:
    p = param(operation(doc, operation_id), name)
    assert p["in"] == "path" and p["required"] is True
    assert p["schema"]["pattern"] == NAME_PATTERN
    assert "422" in operation(doc, operation_id)["responses"]


def test_slot_ids_carry_the_pattern_the_server_checks(doc: dict[str, Any]) -> None:
    for operation_id in ("renewSlot", "releaseSlot"):
        schema = param(operation(doc, operation_id), "slot_id")["schema"]
        # The app checks path parameters against these very schemas
        # (server/params.py); tests/http/test_route_table.py sends requests.
        assert schema["pattern"] == schemas.SLOT_ID_PATTERN


@pytest.mark.parametrize("operation_id", ["listLocks", "listPools"])
def test_list_query_parameters_are_typed(doc: dict[str, Any], operation_id: str) -> None:
    op = operation(doc, operation_id)
    limit = param(op, "limit")
    assert limit["in"] == "query" and limit["required"] is False
    assert limit["schema"] == {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}
    assert param(op, "prefix")["schema"]["maxLength"] == 128
    assert "422" in op["responses"]


@pytest.mark.parametrize("operation_id, headers", [
    ("acquireLock", ("X-Lock-Token", "X-Request-Id")),
    ("renewLease", ("X-Lock-Token", "X-Request-Id")),
    ("releaseLease", ("X-Lock-Token",)),
])
def test_lock_headers_are_required_uuids(doc: dict[str, Any], operation_id: str,
                                         headers: tuple[str, ...]) -> None:
    op = operation(doc, operation_id)
    for name in headers:
        p = param(op, name)
        assert p["in"] == "header" and p["required"] is True
        assert p["schema"] == {"type": "string", "format": "uuid"}
    assert "invalid_request" in str(op["responses"]["400"])


def test_request_bodies_refuse_unknown_fields_and_state_their_bounds(doc: dict[str, Any]
                                                                     ) -> None:
    bodies = {op["operationId"]: resolve(doc, op["requestBody"]["content"]["application/json"]
                                         ["schema"])
              for _, _, op in operations(doc)
              if "application/json" in op.get("requestBody", {}).get("content", {})}
    assert set(bodies) == {"acquireLock", "renewLease", "putPool", "patchPool", "acquireSlot",
                           "renewSlot", "releaseSlot", "createKey", "refreshKey",
                           "createSession", "renewSession", "acquireLockSet"}
    for operation_id, schema in bodies.items():
        assert schema["type"] == "object" and schema["additionalProperties"] is False, \
            operation_id
    # Proxy mode passes any body through, of any media type, unread.
    passed = {op["operationId"]: op["requestBody"] for _, _, op in operations(doc)
              if "application/json" not in op.get("requestBody", {}).get("content", {})
              and "requestBody" in op}
    assert set(passed) == {"proxyPost", "proxyPut", "proxyPatch"}
    assert all(body["content"] == {"*/*": {"schema": {}}} and body["required"] is False
               for body in passed.values())
    rate = resolve(doc, bodies["releaseSlot"]["properties"]["rate"]["anyOf"][0])
    assert rate["additionalProperties"] is False
    ttl = bodies["acquireLock"]["properties"]["ttl_seconds"]
    assert (ttl["type"], ttl["minimum"], ttl["maximum"]) == ("integer", 5, 7776000)
    assert bodies["acquireLock"]["required"] == ["ttl_seconds"]
    assert bodies["acquireLock"]["properties"]["on_expiry"]["enum"] == ["keep", "release"]
    limit = bodies["putPool"]["properties"]["limit"]
    assert (limit["type"], limit["minimum"], limit["maximum"]) == ("integer", 1, 10000)
    # PATCH: every field optional, with PUT's bounds.
    assert not bodies["patchPool"].get("required")
    patch_limit = bodies["patchPool"]["properties"]["limit"]
    assert (patch_limit["type"], patch_limit["minimum"], patch_limit["maximum"]) \
        == ("integer", 1, 10000)
    assert bodies["acquireLock"]["properties"]["mode"]["enum"] == ["exclusive", "shared"]
    keys = bodies["acquireLockSet"]["properties"]["keys"]
    assert (keys["minItems"], keys["maxItems"], keys["uniqueItems"]) == (1, 32, True)
    assert bodies["acquireLockSet"]["required"] == ["keys", "ttl_seconds"]
    delay = bodies["acquireLock"]["properties"]["lock_delay_seconds"]
    assert (delay["type"], delay["minimum"], delay["maximum"]) == ("integer", 0, 60)
    for operation_id in ("acquireSlot", "renewSlot", "releaseSlot", "refreshKey"):
        assert operation(doc, operation_id)["requestBody"]["required"] is False
    session_ttl = bodies["createSession"]["properties"]["ttl_seconds"]
    assert (session_ttl["type"], session_ttl["minimum"], session_ttl["maximum"]) \
        == ("integer", 5, 3600)
    assert bodies["renewSession"]["required"] == ["ttl_seconds"]
    attach = bodies["acquireLock"]["properties"]["session_id"]["anyOf"][0]
    assert attach["pattern"] == "^ses_[A-Za-z0-9_-]{16,64}$"


def test_every_error_answer_has_the_error_body_and_its_codes(doc: dict[str, Any]) -> None:
    for method, path, op in operations(doc):
        for status, response in op["responses"].items():
            assert "X-Request-Id" in response["headers"], (method, path, status)
            if status.startswith("2"):
                continue
            schema = response["content"]["application/json"]["schema"]
            assert schema["allOf"][0] == {"$ref": "#/components/schemas/ErrorBody"}
            codes = schema["allOf"][1]["properties"]["error"]["properties"]["code"]["enum"]
            assert codes and all(f"`{code}`" in response["description"] for code in codes)


def test_each_kind_of_route_lists_the_errors_it_can_give(doc: dict[str, Any]) -> None:
    for method, path, op in operations(doc):
        statuses = set(op["responses"])
        if op["security"]:
            assert {"401", "403", "429", "503"} <= statuses, (method, path)
        if "requestBody" in op:
            assert {"400", "413", "422"} <= statuses, (method, path)
    assert "409" in operation(doc, "acquireLock")["responses"]
    assert {"404", "429", "504"} <= set(operation(doc, "acquireSlot")["responses"])
    codes = str(operation(doc, "acquireSlot")["responses"]["429"])
    assert "too_many_requests" in codes and "quota_exceeded" in codes
    assert operation(doc, "getHealth")["security"] == []


def test_the_slot_grant_documents_its_headers(doc: dict[str, Any]) -> None:
    headers = operation(doc, "acquireSlot")["responses"]["200"]["headers"]
    assert {"X-Remaining-Slots", "X-Effective-Limit", "X-Queued-Ms"} <= set(headers)


def test_both_force_release_answers_match_the_document(server: ServerProcess,
                                                       doc: dict[str, Any]) -> None:
    schema = operation(doc, "forceReleaseLock")["responses"]["200"]["content"][
        "application/json"]["schema"]
    validator = jsonschema.Draft202012Validator({**schema, "components": doc["components"]})
    name = unique_name("force")
    with server.client() as c:
        not_held = c.delete(f"/v1/locks/{name}")
        assert not_held.status_code == 200 and not_held.json()["released"] is False
        resp = c.put(f"/v1/locks/{name}/lease", headers=lock_headers(new_token()),
                     json={"ttl_seconds": 60})
        assert resp.status_code == 201, resp.text
        held = c.delete(f"/v1/locks/{name}")
        assert held.status_code == 200 and held.json()["released"] is True
    for answer in (not_held.json(), held.json()):
        errors = [e.message for e in validator.iter_errors(answer)]
        assert errors == [], (answer, errors)
    assert not validator.is_valid({"released": True, "key": name, "message": "x"})
