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


# The shown output of a command cheap enough to run here: the block's first lines -> the
# command (a module's main and its arguments), run in `in_a_project` where it reads ckpt/tiny,
# 100 columns wide. The block is the printout from its first line on (a help's usage lines,
# which name every flag, are left out); it may end with a line `...`: the lines above it are
# the lines printed from there.
SHOWN = {"ckpt/tiny: 64 facts": ("analyses.locate_facts", ["ckpt/tiny", "--quiet", "--device", "cpu"]),
         "ckpt/tiny: 1 chosen fact": ("analyses.locate_facts", ["ckpt/tiny", "--facts", "3:1", "--quiet",
                                                                "--device", "cpu"]),
         "positional arguments:\n  {association,distribution}": ("models.aot.train", ["--help"]),
         "positional arguments:\n  ckpt ": ("analyses.locate_facts", ["--help"])}

# What a shown output and the printout must share exactly: every word, every label (a token
# name such as S3 or R1:a3, a head, an interval's level) and every number's format (its sign,
# its digits after the point). A number may differ by one unit of its last digit (a value on
# a rounding boundary: 7.17 against 7.18) plus a share of its size, RELATIVE or, on a line that
# counts facts by where they are stored, COUNTED. The numbers come from a model trained on the
# reader's CPU, whose order of summation differs from ours; changing every initial weight of
# the tiny preset by one float32 ulp (the size of such a difference) and training again, nine
# times, moved its margins, scores and patching shares by up to 0.03 (0.81 -> 0.84), and its
# storage split from 53 / 11 facts to 55 / 9, the 11's bootstrap bounds from [7.8, 26.6] to
# [6.2, 21.9]: a fact near the boundary between two places moves with the CPU.
RELATIVE, COUNTED = 0.05, 0.25
COUNTING = re.compile(r"^  (attention|mlp|both|distributed|not_stored) ")
LABEL = re.compile(r"head \d+|\d+% CI|[A-Za-z_]\w*(?::\w+)?")  # words and labels: S3, R1:a3, facts_3-1
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def shown_parts(line: str) -> tuple[str, list[str]]:
    """The line's skeleton (words and labels kept, each number replaced by its format, a column's
    padding by one space) and its numbers as printed."""
    skeleton, numbers, at = [], [], 0
    for m in re.finditer(f"{LABEL.pattern}|{NUMBER.pattern}", line):
        text = m.group()
        if LABEL.fullmatch(text):
            skeleton.append(line[at:m.end()])
        else:
            sign = text[0] if text[0] in "+-" else ""
            skeleton.append(f"{line[at:m.start()]}<{sign}number.{len(text.partition('.')[2])}>")
            numbers.append(text)
        at = m.end()
    return re.sub(r"(?<=\S) +", " ", "".join(skeleton) + line[at:]), numbers


def close(shown: str, printed: str, relative: float) -> bool:
    """The same number up to one unit of the shown number's last digit and `relative` of its size."""
    a, b = float(shown), float(printed)
    unit = 10.0 ** -len(shown.partition(".")[2])
    return abs(a - b) <= 1.001 * unit + relative * max(abs(a), abs(b))


def output_differences(shown: list[str], printed: list[str]) -> list[str]:
    """Where the printout departs from the shown lines: a missing or extra line, a word, label
    or format that differs, or a number outside its tolerance."""
    if len(shown) != len(printed):
        return [f"{len(shown)} lines shown, {len(printed)} printed"]
    differences = []
    for n, (a, b) in enumerate(zip(shown, printed), 1):
        (skeleton_a, numbers_a), (skeleton_b, numbers_b) = shown_parts(a), shown_parts(b)
        relative = COUNTED if COUNTING.match(a) else RELATIVE
        if skeleton_a != skeleton_b or not all(close(x, y, relative) for x, y in zip(numbers_a, numbers_b)):
            differences.append(f"line {n}: shown {a!r}, printed {b!r}")
    return differences


def test_the_shown_output_comparison_keeps_words_and_labels_and_bounds_numbers():
    shown = "fact S3 R1 -> R1:a3: mlp; margin 7.17 logits [95% CI 6.81, 7.52] (+5); head 2: subject +0.81, -0.00"
    same = ["fact S3 R1 -> R1:a3: mlp; margin 7.18 logits [95% CI 6.82, 7.53] (+5); head 2: subject +0.81, -0.00",
            "fact S3 R1 -> R1:a3: mlp; margin 7.19 logits [95% CI 6.84, 7.52] (+6); head 2: subject +0.84, -0.01"]
    differ = ["fact S3 R1 -> R1:a2: mlp; margin 7.17 logits [95% CI 6.81, 7.52] (+5); head 2: subject +0.81, -0.00",
              "fact S3 R1 -> R1:a3: both; margin 7.17 logits [95% CI 6.81, 7.52] (+5); head 2: subject +0.81, -0.00",
              "fact S3 R1 -> R1:a3: mlp; margin 7.17 nats [95% CI 6.81, 7.52] (+5); head 2: subject +0.81, -0.00",
              "fact S3 R1 -> R1:a3: mlp; margin 7.17 logits [90% CI 6.81, 7.52] (+5); head 2: subject +0.81, -0.00",
              "fact S3 R1 -> R1:a3: mlp; margin 7.17 logits [95% CI 6.81, 7.52] (+5); head 3: subject +0.81, -0.00",
              "fact S3 R1 -> R1:a3: mlp; margin 7.170 logits [95% CI 6.81, 7.52] (+5); head 2: subject +0.81, -0.00",
              "fact S3 R1 -> R1:a3: mlp; margin 7.17 logits [95% CI 6.81, 7.52] (+5); head 2: subject 0.81, -0.00",
              "fact S3 R1 -> R1:a3: mlp; margin 7.17 logits [95% CI 6.81, 7.52] (+5); head 2: subject -0.81, -0.00",
              "fact S3 R1 -> R1:a3: mlp; margin 7.67 logits [95% CI 6.81, 7.52] (+5); head 2: subject +0.81, -0.00",
              "fact S3 R1 -> R1:a3: mlp; margin 7.17 logits [95% CI 6.81, 7.52] (+5); head 2: subject +0.90, -0.00",
              "fact S3 R1 -> R1:a3: mlp; margin 7.17 logits [95% CI 6.81, 7.52] (+5); head 2: subject +0.81, -0.00 x"]
    assert [output_differences([shown], [line]) for line in same] == [[], []]
    assert [line for line in differ if not output_differences([shown], [line])] == []
    assert output_differences(["a", "b"], ["a"]) == ["2 lines shown, 1 printed"]
    split = "  both            11   17.2%  [7.8, 26.6]"  # a count of facts: as far as a CPU moves it
    assert output_differences([split], ["  both             9   14.1%  [6.2, 21.9]"]) == []
    assert output_differences([split], ["  both             5    7.8%  [1.6, 14.1]"])
    assert output_differences([split], ["  mlp             11   17.2%  [7.8, 26.6]"])


def shown_blocks() -> list[tuple[Path, str]]:
    return [(page, block) for page in PAGES for block in code_blocks(page, "")
            if any(block.startswith(first) for first in SHOWN)]


@pytest.mark.parametrize("page, block", shown_blocks(), ids=lambda x: str(x.relative_to(ROOT)) if isinstance(x, Path)
                         else "")
def test_shown_output_is_what_the_command_prints(page, block, request, capsys, monkeypatch):
    if TEST_DEVICE.type != "cpu":
        pytest.skip("the shown output is the CPU's")
    module, argv = next(command for first, command in SHOWN.items() if block.startswith(first))
    if "ckpt/tiny" in argv:
        request.getfixturevalue("in_a_project")
    monkeypatch.setenv("COLUMNS", "100")
    capsys.readouterr()
    try:
        assert importlib.import_module(module).main(argv) == 0
    except SystemExit as done:  # --help
        assert done.code == 0
    printed = capsys.readouterr().out.splitlines()
    shown = block.splitlines()
    printed = printed[printed.index(shown[0]):] if shown[0] in printed else printed
    if shown[-1] == "...":
        shown, printed = shown[:-1], printed[:len(shown) - 1]
    assert output_differences(shown, printed) == []


def test_shown_outputs_are_found():
    assert {str(page.relative_to(ROOT)) for page, _ in shown_blocks()} == {"README.md", "docs/locate_facts.md",
                                                                            "docs/training.md"}
