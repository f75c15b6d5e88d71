"""The user-facing Markdown: every relative link (and its #anchor) resolves, every quoted
`python -m` command of the toolkit names a command that takes each of its flags, and the
README stays short enough to read in five minutes."""
import contextlib
import functools
import importlib
import io
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


def quoted_commands(page: Path) -> list[tuple[str, str | None, list[str]]]:
    """Every `python -m MODULE [SUBCOMMAND] --flag ...` of the toolkit in the page's code
    blocks: (module, subcommand, long flags)."""
    commands = []
    for block in FENCE.findall(page.read_text()):
        for line in block.replace("\\\n", " ").splitlines():
            m = re.search(r"python -m ((?:models|analyses)\.[\w.]+)(.*)", line)
            if m:
                words = m.group(2).split("#")[0].split()
                sub = words[0] if words and re.fullmatch(r"[a-z]+", words[0]) else None
                commands.append((m.group(1), sub, [w.split("=")[0] for w in words if w.startswith("--")]))
    return commands


@functools.cache
def help_text(module: str, sub: str | None) -> str:
    """What `python -m MODULE [SUBCOMMAND] --help` prints, run in this process."""
    mod = importlib.import_module(module)
    if hasattr(mod, "__path__"):  # a package: its __main__ runs its cli
        mod = importlib.import_module(module + ".__main__")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        mod.main([sub, "--help"] if sub else ["--help"])
    return out.getvalue()


def unknown_flags(page: Path) -> list[str]:
    return [f"{module} {sub or ''} {flag}" for module, sub, flags in quoted_commands(page) for flag in flags
            if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text(module, sub))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_quoted_commands_take_their_flags(page):
    assert unknown_flags(page) == []


def test_an_unknown_flag_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```bash\npython -m analyses.tradeoff grid --heads 1,2 \\\n  --no-such-flag 3 --out x\n```\n")
    assert unknown_flags(page) == ["analyses.tradeoff grid --no-such-flag"]


def test_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
