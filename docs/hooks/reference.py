"""mkdocs hook: the parts of the site that are made from the code at build time.

- `<!-- generated: http-api-reference -->` becomes the HTTP API reference,
  read from the OpenAPI document the server serves at /openapi.json (built
  in-process from the same route table, so the two cannot drift apart);
- `<!-- generated: cli-reference -->` becomes every command's own --help;
- the adaptive-admission chart is taken from bench/results/ (not copied into
  docs/, so there is one file to update).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from mkdocs.structure.files import File, Files

from fencepost.cli import main as cli_main
from fencepost.server.apidoc import op_anchor, operations, schemas, type_text
from fencepost.server.openapi import build_openapi

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "bench" / "results" / "adaptive-latest.png"
API_MARKER = "<!-- generated: http-api-reference -->"
CLI_MARKER = "<!-- generated: cli-reference -->"
HELP_WIDTH = 88


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, "img/adaptive-latest.png", abs_src_path=str(CHART)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if API_MARKER in markdown:
        markdown = markdown.replace(API_MARKER, http_api_markdown())
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_markdown())
    return markdown


class _Markdown:
    def text(self, value: str) -> str:
        return value.replace("|", "\\|")

    def literal(self, value: str) -> str:
        return f"`{value}`"

    def ref(self, name: str) -> str:
        return f"[{name}](#schema-{name.lower()})"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def http_api_markdown() -> str:
    document = json.loads(build_openapi())
    style = _Markdown()
    out: list[str] = []
    for op in operations(document):
        out += [f"### {op.method} `{op.path}` {{#{op_anchor(op)}}}", "",
                f"{op.summary}. {op.description if op.authenticated else 'No key needed.'}", ""]
        if op.params:
            out += ["| parameter | in | required | meaning |", "|---|---|---|---|"]
            out += [f"| `{p.name}` | {p.where} | {'yes' if p.required else 'no'} | "
                    f"{_cell(p.description)} |" for p in op.params]
            out.append("")
        if op.body:
            out += [f"Body: {style.ref(op.body)}", ""]
        out += ["| status | body | meaning |", "|---|---|---|"]
        out += [f"| {r.status} | {style.ref(r.schema) if r.schema else ''} | "
                f"{_cell(r.description)} |" for r in op.replies]
        out.append("")
    out += ["## Schemas", ""]
    for schema in schemas(document):
        out += [f"### {schema.name} {{#schema-{schema.name.lower()}}}", ""]
        if schema.fields:
            out += ["| field | type | required | meaning |", "|---|---|---|---|"]
            out += [f"| `{f.name}` | {type_text(f.schema, style)} | "
                    f"{'yes' if f.required else 'no'} | {_cell(f.description)} |"
                    for f in schema.fields]
        else:
            out.append("Any JSON object.")
        out.append("")
    return "\n".join(out)


def _commands(command: click.Command, path: list[str],
              parent: click.Context | None) -> list[tuple[str, str]]:
    ctx = click.Context(command, info_name=path[-1], parent=parent,
                        terminal_width=HELP_WIDTH, max_content_width=HELP_WIDTH)
    found = [(" ".join(path), command.get_help(ctx))]
    if isinstance(command, click.Group):
        for name in sorted(command.list_commands(ctx)):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                found += _commands(sub, [*path, name], ctx)
    return found


def cli_markdown() -> str:
    out: list[str] = []
    for name, text in _commands(cli_main, ["fencepost"], None):
        out += [f"### `{name}`", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(out)
