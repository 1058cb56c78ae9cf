"""Every link between the project's pages leads somewhere: the file exists, and its `#anchor` names a heading of
the page it points to, as GitHub renders the heading's id. Pages are read with markdown-it (rich's parser), so
what looks like a link inside a code block is not taken for one."""

import re
from functools import cache
from itertools import pairwise
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([REPO / "README.md", REPO / "bench" / "README.md", *(REPO / "docs").glob("*.md")])
PARSER = MarkdownIt("commonmark").enable("table")


def inline_tokens(page: Path) -> list[Token]:
    return [child for token in PARSER.parse(page.read_text()) if token.type == "inline" for child in token.children or []]


def github_id(heading: str) -> str:
    """GitHub's heading id: lowercased, punctuation but `-` and `_` dropped, each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


@cache
def anchors(page: Path) -> set[str]:
    tokens = PARSER.parse(page.read_text())
    found: set[str] = set()
    for opening, inline in pairwise(tokens):
        if opening.type == "heading_open":
            text = "".join(c.content for c in inline.children or [] if c.type in ("text", "code_inline"))
            base, n = github_id(text), 0
            while (slug := base if n == 0 else f"{base}-{n}") in found:
                n += 1
            found.add(slug)
    return found


def links(page: Path) -> list[str]:
    return [str(t.attrs["href"]) for t in inline_tokens(page) if t.type == "link_open"]


def test_the_pages_are_found():
    assert {"README.md", "architecture.md", "operations.md"} <= {p.name for p in PAGES}
    assert all(links(p) for p in (REPO / "README.md", REPO / "docs" / "operations.md"))


def test_heading_ids_follow_github():
    assert github_id("The agent's own receipts") == "the-agents-own-receipts"
    assert github_id("Point an agent at it") == "point-an-agent-at-it"
    assert github_id("`receipts ls`: the journal, by state") == "receipts-ls-the-journal-by-state"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_between_pages_leads_somewhere(page: Path):
    broken = []
    for href in links(page):
        target = urlsplit(href)
        if target.scheme or target.netloc:
            continue
        path = (page.parent / unquote(target.path)).resolve() if target.path else page
        if not path.exists():
            broken.append(f"{href}: no {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
        elif target.fragment and path.suffix == ".md" and target.fragment not in anchors(path):
            broken.append(f"{href}: no heading with that id in {path.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)
