"""What an induction study's --out may hold (the one --out rule's test for it, models.out_folder.claim),
and what a rerun of `reproduce` into the same folder keeps."""
from __future__ import annotations

import json
from pathlib import Path

from analyses import recorded


def study_folder(out: Path) -> None:
    """What a training study's --out may hold (models.out_folder.claim): an induction study's
    results (summary.json naming its studies, a user's files beside them stay), or the training
    state of an interrupted first study; else refused."""
    if (out / "summary.json").is_file() and recorded.holding(out) == "an induction study's results (summary.json)":
        return
    other = sorted(p.name + "/" * p.is_dir() for p in out.iterdir() if p.name not in ("train_state", "probes_model"))
    if other:
        held = recorded.holding(out) or f"files that are not an induction study's results ({', '.join(other[:4])})"
        raise ValueError(f"--out {out} holds {held}, which an induction study does not write over; choose another "
                         "--out.")


def kept_studies(path: Path, summary: dict) -> dict:
    """The summary to go on from: the one at `path` where an earlier reproduce of the same settings
    wrote it (its finished studies are kept, their files beside it), else `summary` (all run again)."""
    if not path.is_file():
        return summary
    earlier = json.loads(path.read_text())
    if earlier.get("settings") != json.loads(json.dumps(summary["settings"])) or "studies" not in earlier:
        print(f"{path}: written at other settings; every study runs again")
        return summary
    return earlier
