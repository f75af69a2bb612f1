"""The examples of the README and docs/: fenced code blocks, read from the
Markdown so that what a reader copies is exactly what the tests run.

Blocks tagged `sh` or `python` are run; other tags (`text`, `json`, `yaml`,
...) are shown, not run. A block is preceded, at most across blank lines, by an
optional directive:

    <!-- docs-test: skip WHY -->   not run, and WHY says why (a crontab line)
    <!-- docs-test: file NAME -->  saved as NAME in the page's folder instead of
                                   run: later blocks run it, and tests run it
                                   on their failure paths
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN_LANGUAGES = {"sh", "python"}
# Tags that look runnable but would be silently skipped: use sh or python.
REFUSED_LANGUAGES = {"bash", "shell", "console", "shell-session", "py", "python3", "zsh"}
DEFAULT_URL = "http://127.0.0.1:7440"

_FENCE = re.compile(r"^(\s*)```([\w+-]*)\s*$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*docs-test:\s*(\w+)\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    language: str
    text: str
    directive: str | None = None  # "skip" or "file"
    argument: str = ""  # the reason (skip) or the file name (file)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.language in RUN_LANGUAGES and self.directive is None


class DocFormatError(ValueError):
    pass


def pages() -> list[Path]:
    """README.md and every page of the site, in a stable order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def page_name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of one page, in order, with their directives."""
    name = page_name(path)
    lines = path.read_text().splitlines()
    found: list[Block] = []
    pending: tuple[str, str, int] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        directive = _DIRECTIVE.match(line)
        fence = _FENCE.match(line)
        if directive:
            if pending is not None:
                raise DocFormatError(f"{name}:{pending[2]}: directive not followed by a block")
            kind, argument = directive.group(1), directive.group(2)
            if kind not in ("skip", "file") or not argument:
                raise DocFormatError(f"{name}:{i + 1}: want 'skip WHY' or 'file NAME'")
            pending = (kind, argument, i + 1)
        elif fence:
            indent, language = fence.group(1), fence.group(2)
            if not language:
                raise DocFormatError(f"{name}:{i + 1}: a fenced block needs a language tag")
            if language in REFUSED_LANGUAGES:
                raise DocFormatError(f"{name}:{i + 1}: tag {language!r}: use sh or python")
            body: list[str] = []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
                i += 1
            if i == len(lines):
                raise DocFormatError(f"{name}:{i}: unclosed block")
            found.append(Block(name, i - len(body), language, "\n".join(body) + "\n",
                               pending[0] if pending else None, pending[1] if pending else ""))
            pending = None
        elif line.strip() and pending is not None:
            raise DocFormatError(f"{name}:{pending[2]}: directive not followed by a block")
        i += 1
    if pending is not None:
        raise DocFormatError(f"{name}:{pending[2]}: directive not followed by a block")
    return found


def file_block(page: str, file_name: str) -> Block:
    """The block a page saves as `file_name` (the recipes' scripts)."""
    for block in blocks(ROOT / page):
        if block.directive == "file" and block.argument == file_name:
            return block
    raise LookupError(f"{page} has no block saved as {file_name}")


_ASSIGNED = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=", re.MULTILINE)


def assigned_names(text: str) -> list[str]:
    """Shell variables a block sets, to carry them to the page's later blocks."""
    return sorted(set(_ASSIGNED.findall(text)))
