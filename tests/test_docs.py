"""The user-facing Markdown: every relative link (and its #anchor) resolves, and the README
stays short enough to read in five minutes."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", ROOT / "bench" / "README.md", *(ROOT / "docs").glob("*.md"),
                *(ROOT / "results").glob("**/README.md")])
FENCE = re.compile(r"```.*?```", re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return "".join(c for c in heading.strip().lower() if c.isalnum() or c in "-_ ").replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The page's heading anchors; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6}\s+(.*)$", FENCE.sub("", page.read_text()), re.M):
        s = slug(heading)
        seen[s] = seen.get(s, -1) + 1
    return {s if n == 0 else f"{s}-{n}" for s, count in seen.items() for n in range(count + 1)}


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists() or (anchor and (dest.suffix != ".md" or anchor not in anchors(dest))):
            broken.append(target)
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    assert broken_links(page) == []


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A heading\n[ok](#a-heading) [gone](missing.md) [no anchor](#elsewhere)\n")
    assert broken_links(page) == ["missing.md", "#elsewhere"]


def test_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
