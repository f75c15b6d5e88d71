"""The user-facing Markdown: every relative link (and its #anchor) resolves, every quoted
`python -m` command of the toolkit names a command that takes each of its flags, every
Python block runs and every JSON block parses, the output shown of a cheap command is what it
prints, and the README stays short enough to read in five minutes."""
import contextlib
import functools
import importlib
import io
import json
import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import TEST_DEVICE

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


def code_blocks(page: Path, language: str) -> list[str]:
    """The page's fenced blocks of `language` ('' for plain blocks: shown output), in order."""
    return [block for lang, block in re.findall(r"^```(\w*)\n(.*?)^```", page.read_text(), re.S | re.M)
            if lang == language]


@pytest.fixture
def in_a_project(tiny_ckpt, tmp_path, monkeypatch) -> Path:
    """A working folder where ckpt/tiny is (a copy of) the tiny preset's checkpoint, as the
    README's quick start leaves it."""
    shutil.copytree(tiny_ckpt, tmp_path / "ckpt" / "tiny", ignore=shutil.ignore_patterns("analysis"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("page", [p for p in PAGES if code_blocks(p, "python")], ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run(page, in_a_project):
    """Each page's Python blocks, in order, in one namespace, as a reader pastes them."""
    namespace: dict = {}
    for n, block in enumerate(code_blocks(page, "python")):
        exec(compile(block, f"{page.name}, Python block {n + 1}", "exec"), namespace)


def test_json_blocks_parse():
    for page in PAGES:
        for block in code_blocks(page, "json"):
            json.loads(block)


# The shown output of a command cheap enough to run here: the block's first line -> the
# command (a module's main and its arguments), run in `in_a_project`. A shown block may end
# with a line `...`: the lines above it are the first lines printed.
SHOWN = {"ckpt/tiny: 64 facts": ("analyses.locate_facts", ["ckpt/tiny", "--quiet", "--device", "cpu"]),
         "ckpt/tiny: 1 chosen fact": ("analyses.locate_facts", ["ckpt/tiny", "--facts", "3:1", "--quiet",
                                                                "--device", "cpu"])}


def shown_blocks() -> list[tuple[Path, str]]:
    return [(page, block) for page in PAGES for block in code_blocks(page, "")
            if any(block.startswith(first) for first in SHOWN)]


@pytest.mark.parametrize("page, block", shown_blocks(), ids=lambda x: str(x.relative_to(ROOT)) if isinstance(x, Path)
                         else "")
def test_shown_output_is_what_the_command_prints(page, block, in_a_project, capsys):
    if TEST_DEVICE.type != "cpu":
        pytest.skip("the shown output is the CPU's")
    module, argv = next(command for first, command in SHOWN.items() if block.startswith(first))
    capsys.readouterr()
    assert importlib.import_module(module).main(argv) == 0
    printed = capsys.readouterr().out.splitlines()
    shown = block.splitlines()
    if shown[-1] == "...":
        shown, printed = shown[:-1], printed[:len(shown) - 1]
    assert shown == printed


def test_shown_outputs_are_found():
    assert {str(page.relative_to(ROOT)) for page, _ in shown_blocks()} == {"README.md", "docs/locate_facts.md"}
