"""A readable API reference made from the OpenAPI document.

The document (`/openapi.json`) is read into plain rows: operations with their
parameters and responses, and schemas with their fields. The server renders
them as one self-contained HTML page at `/docs` (`render_html`), and the
documentation site's build renders the same rows as Markdown, so both say
exactly what `/openapi.json` says.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from importlib.resources import files
from typing import Any, Protocol

_REF_PREFIX = "#/components/schemas/"


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    where: str  # path, header or query
    required: bool
    description: str


@dataclass(frozen=True, slots=True)
class Reply:
    status: str
    schema: str | None  # a schema name, or None when the body is not JSON
    description: str


@dataclass(frozen=True, slots=True)
class Operation:
    method: str
    path: str
    summary: str
    description: str
    authenticated: bool
    params: tuple[Param, ...]
    body: str | None
    replies: tuple[Reply, ...]


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    schema: dict[str, Any]
    required: bool

    @property
    def description(self) -> str:
        text = str(self.schema.get("description", ""))
        if "default" in self.schema:
            default = json.dumps(self.schema["default"])
            text = f"{text} Default: {default}.".strip()
        return text


@dataclass(frozen=True, slots=True)
class Schema:
    name: str
    fields: tuple[Field, ...]


class Style(Protocol):
    """How a renderer writes plain text, a literal value and a schema reference."""

    def text(self, value: str) -> str: ...

    def literal(self, value: str) -> str: ...

    def ref(self, name: str) -> str: ...


def _ref_name(schema: dict[str, Any]) -> str | None:
    ref = schema.get("$ref")
    return ref.removeprefix(_REF_PREFIX) if isinstance(ref, str) else None


def operations(document: dict[str, Any]) -> list[Operation]:
    """Every operation, in the document's order (the route table's)."""
    found: list[Operation] = []
    for path, methods in document.get("paths", {}).items():
        for method, op in methods.items():
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {})
            replies = []
            for status, reply in op.get("responses", {}).items():
                content = reply.get("content", {}).get("application/json")
                schema = _ref_name(content["schema"]) if content else None
                replies.append(Reply(status, schema, str(reply.get("description", ""))))
            found.append(Operation(
                method=method.upper(), path=path, summary=str(op.get("summary", "")),
                description=str(op.get("description", "")),
                authenticated=bool(op.get("security")),  # [] means no key
                params=tuple(
                    Param(p["name"], p["in"], bool(p.get("required")),
                          str(p.get("description", "")))
                    for p in op.get("parameters", [])
                ),
                body=_ref_name(body["schema"]) if body else None,
                replies=tuple(replies),
            ))
    return found


def schemas(document: dict[str, Any]) -> list[Schema]:
    """Every schema with its fields, sorted by name."""
    found = []
    for name, schema in sorted(document.get("components", {}).get("schemas", {}).items()):
        required = set(schema.get("required", []))
        fields = tuple(Field(field, spec, field in required)
                       for field, spec in schema.get("properties", {}).items())
        found.append(Schema(name, fields))
    return found


def type_text(schema: dict[str, Any], style: Style) -> str:
    """A field's type in a few words: `integer 5..7776000`, `string or null`, ..."""
    name = _ref_name(schema)
    if name is not None:
        return style.ref(name)
    if "anyOf" in schema:
        parts = [type_text(part, style) for part in schema["anyOf"]]
        return style.text(" or ").join(parts)
    if "enum" in schema:
        return style.text(" / ").join(style.literal(json.dumps(v)) for v in schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        text = style.text("array of ") + type_text(schema.get("items", {}), style)
        if "maxItems" in schema:
            text += style.text(f" (at most {schema['maxItems']})")
        return text
    if kind == "object" and "additionalProperties" in schema and isinstance(
            schema["additionalProperties"], dict):
        return style.text("object of ") + type_text(schema["additionalProperties"], style)
    words = str(kind or "any")
    if "format" in schema:
        words += f" ({schema['format']})"
    low = schema.get("minimum", schema.get("minLength"))
    high = schema.get("maximum", schema.get("maxLength"))
    if low is not None or high is not None:
        span = f"{'' if low is None else low}..{'' if high is None else high}"
        words += f" {span}" if "minimum" in schema or "maximum" in schema else f", length {span}"
    return style.text(words)


class _Html:
    def text(self, value: str) -> str:
        return html.escape(value)

    def literal(self, value: str) -> str:
        return f"<code>{html.escape(value)}</code>"

    def ref(self, name: str) -> str:
        return f'<a href="#schema-{html.escape(name)}">{html.escape(name)}</a>'


def op_anchor(op: Operation) -> str:
    """The id of an operation's section: the same on /docs and on the site."""
    slug = "".join(c if c.isalnum() else "-" for c in op.path.strip("/"))
    return f"op-{op.method.lower()}-{slug}"


def render_html(document: dict[str, Any]) -> str:
    """One HTML page, styles inline and no scripts: nothing is fetched from
    anywhere else, so it works offline and behind any firewall."""
    style = _Html()
    esc = html.escape
    info = document.get("info", {})
    ops = operations(document)
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(str(info.get('title', 'API')))} API reference</title>",
        f"<style>{files('fencepost.server').joinpath('assets/api-docs.css').read_text()}</style>",
        "</head><body><main>",
        f"<h1>{esc(str(info.get('title', '')))} {esc(str(info.get('version', '')))}"
        " API reference</h1>",
        f"<p>{esc(str(info.get('description', '')))} Generated from "
        '<a href="/openapi.json">/openapi.json</a>. Authenticate with '
        "<code>Authorization: Bearer &lt;key&gt;</code> or <code>X-Api-Key: &lt;key&gt;</code>;"
        " every error is <code>{\"error\": {\"code\", \"message\", ...}}</code>.</p>",
        "<nav><h2>Operations</h2><ul>",
    ]
    out += [f'<li><a href="#{op_anchor(op)}"><span class="method">{op.method}</span> '
            f"<code>{esc(op.path)}</code></a> {esc(op.summary)}</li>" for op in ops]
    out.append("</ul></nav>")
    for op in ops:
        out.append(f'<section id="{op_anchor(op)}"><h2><span class="method">{op.method}</span> '
                   f"<code>{esc(op.path)}</code></h2><p>{esc(op.summary)}. "
                   f"{esc(op.description) if op.authenticated else 'No key needed.'}</p>")
        if op.params:
            out.append("<table><tr><th>parameter</th><th>in</th><th>required</th>"
                       "<th>meaning</th></tr>")
            out += [f"<tr><td><code>{esc(p.name)}</code></td><td>{p.where}</td>"
                    f"<td>{'yes' if p.required else 'no'}</td><td>{esc(p.description)}</td></tr>"
                    for p in op.params]
            out.append("</table>")
        if op.body:
            out.append(f"<p>Body: {style.ref(op.body)}</p>")
        out.append("<table><tr><th>status</th><th>body</th><th>meaning</th></tr>")
        out += [f"<tr><td>{esc(r.status)}</td><td>{style.ref(r.schema) if r.schema else ''}"
                f"</td><td>{esc(r.description)}</td></tr>" for r in op.replies]
        out.append("</table></section>")
    out.append("<h2>Schemas</h2>")
    for schema in schemas(document):
        out.append(f'<section id="schema-{esc(schema.name)}"><h3>{esc(schema.name)}</h3>')
        if schema.fields:
            out.append("<table><tr><th>field</th><th>type</th><th>required</th>"
                       "<th>meaning</th></tr>")
            out += [f"<tr><td><code>{esc(f.name)}</code></td><td>{type_text(f.schema, style)}"
                    f"</td><td>{'yes' if f.required else 'no'}</td>"
                    f"<td>{esc(f.description)}</td></tr>" for f in schema.fields]
            out.append("</table>")
        out.append("</section>")
    out.append("</main></body></html>")
    return "\n".join(out)
