"""The docs' shown output is regenerated from the commands (scripts/refresh_docs.py), and what
every marked region shows is what its command prints: its words, labels, counts and line
shapes exactly, its measured (decimal) numbers within the tolerance of the numeric shown-output
check (tests/test_docs.py: one unit of the last digit and 5% of the size, what another CPU's
training moves them by), except where the test runs a cheaper command than the page's."""
import contextlib
import importlib
import io
import re
import runpy
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import TEST_DEVICE
from tests.test_docs import output_differences

ROOT = Path(__file__).resolve().parents[1]
refresh = runpy.run_path(str(ROOT / "scripts" / "refresh_docs.py"), run_name="refresh_docs")
NUMBER = re.compile(r"[-+]?\d*\.\d+(?:e[-+]?\d+)?|\b(?:True|False)\b")  # measured: decimals, verdicts
# what the test trains less of than the docs' command: the lines keep their shape
CHEAPER = {"analyses.aot_capacity": ["--batches", "20", "--epochs", "1"]}

PAGE = """# A page

<!-- shown: python -m some.command --flag -->
```
old line 1
old line 2
...
```
<!-- /shown -->

text between, kept as it is

<!-- shown: python scripts/table.py -->
| a | b |
| --- | --- |
| 1 | 2 |
<!-- /shown -->
"""


def test_a_marked_block_shows_what_its_command_printed_and_keeps_its_cut():
    outputs = {"python -m some.command --flag": "new 1\nnew 2\nnew 3\nnew 4\n",
               "python scripts/table.py": "| a | b |\n| --- | --- |\n| 3 | 4 |\n"}
    assert [c for c, _ in refresh["regions"](PAGE)] == list(outputs)
    new = refresh["rewrite"](PAGE, outputs)
    assert new == PAGE.replace("old line 1\nold line 2\n", "new 1\nnew 2\n").replace("| 1 | 2 |", "| 3 | 4 |")
    uncut = PAGE.replace("old line 2\n...\n", "old line 2\n")
    assert "```\nnew 1\nnew 2\nnew 3\nnew 4\n```\n" in refresh["rewrite"](uncut, outputs)
    assert refresh["rewrite"](new, outputs) == new  # refreshed twice: the same page


def test_a_mark_without_its_end_is_refused():
    with pytest.raises(ValueError, match="without its"):
        refresh["regions"]("<!-- shown: python -m x -->\n```\n```\n")


def marked() -> list[tuple[Path, str, str]]:
    """(page, command, region) of every marked region of the docs."""
    return [(page, command, body) for page in refresh["pages"]()
            for command, body in refresh["regions"](page.read_text())]


def test_the_docs_mark_what_they_show():
    pages = {str(page.relative_to(ROOT)) for page, _, _ in marked()}
    assert {"README.md", "docs/locate_facts.md", "docs/aot_capacity.md", "docs/visualize_report.md"} <= pages


@pytest.fixture(scope="module")
def printed(tiny_ckpt, tmp_path_factory):
    """What a marked command prints, each in a fresh project holding the checkpoints it names
    (ckpt/tiny the session's tiny preset, the constructions built here), run in this process."""
    built = tmp_path_factory.mktemp("built")
    shutil.copytree(tiny_ckpt, built / "ckpt" / "tiny", ignore=shutil.ignore_patterns("analysis"))
    from models.recall.constructions import main as construct
    with contextlib.redirect_stdout(io.StringIO()):
        for kind, name in (("attention", "theorem3"), ("mlp", "theorem4")):
            construct(["--kind", kind, "--out", str(built / "ckpt" / name)])
    seen: dict[str, str] = {}

    def run(command: str) -> str:
        if command not in seen:
            here = tmp_path_factory.mktemp("run")
            for name in ("tiny", "theorem3", "theorem4"):
                if f"ckpt/{name}" in command:
                    shutil.copytree(built / "ckpt" / name, here / "ckpt" / name)
            words = shlex.split(command)[1:]
            out = io.StringIO()
            with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out):
                patch.chdir(here)
                patch.setenv("FACTUAL_RECALL_PROGRESS", "0")
                if words[0] == "-m":
                    module = importlib.import_module(words[1])
                    if hasattr(module, "__path__"):
                        module = importlib.import_module(words[1] + ".__main__")
                    assert module.main([*words[2:], *CHEAPER.get(words[1], [])]) in (0, None)
                else:
                    patch.setattr(sys, "argv", words)
                    runpy.run_path(str(ROOT / words[0]), run_name="__main__")
            seen[command] = out.getvalue()
        return seen[command]
    return run


def shape(lines: list[str]) -> list[str]:
    """Lines with every measured number (a decimal; True/False) as #: their words, labels, counts
    and layout (the facts a view shows, how many facts a label has, how many points a fit had)."""
    return [NUMBER.sub("#", line) for line in lines]


@pytest.mark.parametrize("page, command, body", [pytest.param(*region, id=f"{region[0].relative_to(ROOT)}-{n}")
                                                  for n, region in enumerate(marked())])
def test_each_marked_region_has_the_words_and_labels_its_command_prints(page, command, body, printed):
    if TEST_DEVICE.type != "cpu":
        pytest.skip("the shown output is the CPU's")
    shown = body.rstrip("\n").splitlines()
    if shown[0].startswith("```"):
        shown = shown[1:-1]
    output = printed(command).rstrip("\n").splitlines()
    if shown[-1] == "...":
        shown, output = shown[:-1], output[:len(shown) - 1]
    assert shape(shown) == shape(output)
    if not any(module in command for module in CHEAPER):
        assert output_differences(shown, output) == []
