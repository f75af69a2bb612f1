"""The API reference's reading of the OpenAPI document (server/apidoc.py), on
the real document and on small hand-made schemas."""

from __future__ import annotations

import json
from typing import Any

from fencepost.server.apidoc import operations, render_html, schemas, type_text
from fencepost.server.openapi import build_openapi


class _Plain:
    def text(self, value: str) -> str:
        return value

    def literal(self, value: str) -> str:
        return value

    def ref(self, name: str) -> str:
        return f"<{name}>"


def _document() -> dict[str, Any]:
    return dict(json.loads(build_openapi()))


def test_types_read_as_words() -> None:
    style = _Plain()
    assert type_text({"type": "integer", "minimum": 5, "maximum": 7776000}, style) \
        == "integer 5..7776000"
    assert type_text({"type": "string", "minLength": 1, "maxLength": 64}, style) \
        == "string, length 1..64"
    assert type_text({"anyOf": [{"type": "integer"}, {"type": "null"}]}, style) \
        == "integer or null"
    assert type_text({"enum": ["keep", "release"]}, style) == '"keep" / "release"'
    assert type_text({"type": "array", "items": {"$ref": "#/components/schemas/LockState"},
                      "maxItems": 3}, style) == "array of <LockState> (at most 3)"
    assert type_text({"type": "string", "format": "uuid"}, style) == "string (uuid)"


def test_every_operation_and_schema_of_the_document_is_read() -> None:
    document = _document()
    ops = operations(document)
    assert len(ops) == sum(len(methods) for methods in document["paths"].values())
    acquire = next(op for op in ops if op.method == "PUT" and op.path == "/v1/locks/{key}/lease")
    assert acquire.body == "AcquireLockBody" and acquire.authenticated
    assert {p.name for p in acquire.params} >= {"key", "X-Lock-Token", "X-Request-Id"}
    assert ("201", "LeaseGrant") in {(r.status, r.schema) for r in acquire.replies}
    health = next(op for op in ops if op.path == "/healthz")
    assert not health.authenticated
    names = {s.name for s in schemas(document)}
    assert names == set(document["components"]["schemas"])
    body = next(s for s in schemas(document) if s.name == "AcquireLockBody")
    ttl = next(f for f in body.fields if f.name == "ttl_seconds")
    assert ttl.required and "Lease length" in ttl.description


def test_html_escapes_what_it_shows() -> None:
    document = _document()
    document["info"]["description"] = "<script>alert(1)</script>"
    page = render_html(document)
    assert "<script>" not in page and "&lt;script&gt;" in page
