"""Every relative link of the README and docs/ leads somewhere: the file exists and, when the
link names a heading (``file.md#anchor``), the file has that heading, as GitHub renders it.
A document renamed or a heading reworded breaks the links to it; this finds them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(document: Path) -> set[str]:
    """The anchors of a document's headings (a repeated one gets -1, -2...)."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", document.read_text())):
        name = slug(heading)
        count = seen.get(name, 0)
        seen[name] = count + 1
        found.add(name if count == 0 else f"{name}-{count}")
    return found


def broken(document: Path) -> list[str]:
    """The relative links of ``document`` that lead nowhere."""
    found = []
    for target in LINK.findall(FENCE.sub("", document.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        linked = (document.parent / path) if path else document
        if not linked.exists():
            found.append(f"{target}: no such file")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            found.append(f"{target}: no such heading")
    return found


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.name)
def test_every_relative_link_leads_somewhere(document: Path) -> None:
    assert broken(document) == []


def test_a_link_to_a_missing_heading_or_file_is_found(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Title\n\n## Snapshots: how a replica starts\n\n## Sizing\n")
    (tmp_path / "b.md").write_text(
        "[ok](a.md#snapshots-how-a-replica-starts) [ok](#here) [ok](https://x.org/#y)\n"
        "[no](a.md#sizing-1) [no](c.md) [no](#nowhere)\n\n# Here\n\n```\n[not a link](d.md)\n```\n"
    )
    assert broken(tmp_path / "b.md") == [
        "a.md#sizing-1: no such heading",
        "c.md: no such file",
        "#nowhere: no such heading",
    ]
