"""Regenerate the output the docs show from the commands that print it, never by hand.

A page marks each region that a command prints:

    <!-- shown: python -m analyses.locate_facts ckpt/tiny --quiet --device cpu -->
    ```
    ...what it prints...
    ```
    <!-- /shown -->

This runs every marked command in a fresh scratch project holding the checkpoints it names
(built once: ckpt/tiny by `models.train --preset tiny`, ckpt/theorem3 and ckpt/theorem4 by
`models.recall.constructions`; copied without their analyses), so what a command prints does not
depend on what ran before it, without progress bars, and puts what it printed between
the marks: inside a fence when the region is a fenced block (a block that ends with a line
`...` keeps as many first lines as it showed), as it is otherwise (a Markdown table). The rest
of the page is left byte for byte.

    .venv/bin/python scripts/refresh_docs.py            # every page with marks
    .venv/bin/python scripts/refresh_docs.py docs/aot_capacity.md --check   # exit 1 if it would change

The numbers are those of the machine it runs on; tests/test_refresh_docs.py compares the words,
labels and counts of each region with what its command prints (tests/test_docs.py, the numbers).
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARK = re.compile(r"^<!-- shown: (?P<command>.+?) -->\n(?P<body>.*?)^<!-- /shown -->$", re.S | re.M)
# what a command may name, and the command that makes it in the scratch project
BUILD = {"ckpt/tiny": "python -m models.train --preset tiny --out ckpt/tiny --quiet --device cpu",
         "ckpt/theorem3": "python -m models.recall.constructions --kind attention --out ckpt/theorem3",
         "ckpt/theorem4": "python -m models.recall.constructions --kind mlp --out ckpt/theorem4"}


def pages() -> list[Path]:
    """Every Markdown page of the project."""
    return sorted([ROOT / "README.md", ROOT / "bench" / "README.md", *(ROOT / "docs").glob("*.md"),
                   *(ROOT / "results").glob("**/README.md")])


def regions(text: str) -> list[tuple[str, str]]:
    """(command, the region's text) of every marked region, in order; a `<!-- shown:` mark
    without its `<!-- /shown -->` is refused."""
    found = [(m["command"], m["body"]) for m in MARK.finditer(text)]
    if len(re.findall(r"^<!-- shown: ", text, re.M)) != len(found):
        raise ValueError("a `<!-- shown: COMMAND -->` mark without its `<!-- /shown -->`.")
    return found


def rendered(body: str, output: str) -> str:
    """The region `body` showing `output` instead: a fenced block keeps its fence and its
    truncation (a last line `...` after as many lines as it showed), anything else is the output."""
    printed = output.rstrip("\n").splitlines()
    lines = body.rstrip("\n").splitlines()
    if not lines or not lines[0].startswith("```"):
        return "\n".join(printed) + "\n"
    shown = lines[1:-1]
    if shown and shown[-1] == "...":
        printed = printed[:len(shown) - 1] + ["..."]
    return "\n".join([lines[0], *printed, lines[-1]]) + "\n"


def rewrite(text: str, outputs: dict[str, str]) -> str:
    """`text` with each marked region showing outputs[its command]."""
    return MARK.sub(lambda m: f"<!-- shown: {m['command']} -->\n{rendered(m['body'], outputs[m['command']])}"
                              "<!-- /shown -->", text)


def run(command: str, work: Path) -> str:
    """What `command` prints in a fresh project under `work` holding (copies of) the checkpoints
    it names, without their analyses: each command's output is its own, whatever ran before."""
    here = Path(tempfile.mkdtemp(dir=work, prefix="run_"))
    for name, build in BUILD.items():
        if re.search(rf"(?<![\w/]){re.escape(name)}(?!\w)", command):
            built = work / "built"
            if not (built / name).is_dir():
                built.mkdir(exist_ok=True)
                execute(build, built)
            shutil.copytree(built / name, here / name, ignore=shutil.ignore_patterns("analysis"))
    return execute(command, here)


def execute(command: str, work: Path) -> str:
    """What `command` prints in `work` (`python` is this interpreter, the code and scripts this checkout's)."""
    words = shlex.split(command)
    if words[0] == "python":
        words[0] = sys.executable
    if len(words) > 1 and words[1].endswith(".py"):  # a script of this checkout
        words[1] = str(ROOT / words[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "FACTUAL_RECALL_PROGRESS": "0"}
    done = subprocess.run(words, cwd=work, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"`{command}` failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pages", nargs="*", type=Path, help="pages to refresh (default: every page with marks)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page would change")
    p.add_argument("--work", type=Path, default=None,
                   help="the scratch folder (default: a temporary one); the checkpoints built there are reused")
    args = p.parse_args(argv)
    chosen = [path.resolve() for path in args.pages] or [page for page in pages() if regions(page.read_text())]
    with tempfile.TemporaryDirectory() as scratch:
        work = args.work or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        outputs: dict[str, str] = {}
        texts = {page: page.read_text() for page in chosen}
        for text in texts.values():  # every command runs before any page is written
            for command, _ in regions(text):
                if command not in outputs:
                    print(f"running: {command}", file=sys.stderr)
                    outputs[command] = run(command, work)
    changed = [page for page, text in texts.items() if rewrite(text, outputs) != text]
    if not args.check:
        for page in changed:
            page.write_text(rewrite(texts[page], outputs))
    changed = [page.relative_to(ROOT) for page in changed]
    print(("would change: " if args.check else "refreshed: ") + (", ".join(map(str, changed)) or "nothing"))
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
