"""The project's documentation as the tests read it: README.md (the summary) and docs/ (the
reference), so that a test checking what the docs say finds it wherever it lives."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"


def page(name: str) -> str:
    """``docs/<name>.md``, or the README for ``"README"``."""
    path = README if name == "README" else DOCS / f"{name}.md"
    return path.read_text(encoding="utf-8")


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def all_docs() -> str:
    """Every page, the README first."""
    return "\n\n".join(path.read_text(encoding="utf-8") for path in pages())


def section(text: str, heading: str) -> str:
    """The text under ``heading`` (a whole heading line, e.g. ``"## Verify"``) up to the next
    heading of the same or a higher level."""
    level = heading.split(" ", 1)[0]
    body = text.split("\n" + heading + "\n", 1)[1]
    for line_start in range(len(level), 0, -1):
        body = body.split("\n" + "#" * line_start + " ", 1)[0]
    return body
