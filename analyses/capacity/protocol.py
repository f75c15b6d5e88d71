"""Figure 4 left at the authors' full protocol (25 shapes, d = 8 ... 181, three learning
rates), in pieces that each fit one GPU call of scripts/gpu_run.sh, recorded where the CLI
reads them: results/capacity/paper_fig4_left_full/PIECE_FOLDER/ (one transformer sweep each:
cells/, settings.json, capacity.csv, ...), with every piece's sizes so far in fig4_left.csv
and fig4_left.png beside them.

The pieces, in the order a GPU runs them (largest sizes first):
  d90, d181, d128   (1, 1, 8) at d = 90, 181, 128 over seeds 0, 1, 2 (S*: the largest S most
                    seeds store), each bracketed around the S* the recorded sizes give it
                    (d = 128 last: a GPU record already gives it, imported_h100_d128/)
  alphaA[_mid|_large]  each row of five shapes (one alpha) with seed 0 and the milestone rule,
                    in three parts (d <= 22, <= 64, the rest) sharing the row's folder: each
                    part goes on from the S* the previous one found
  2e16_*            then (1, 1, 8) at d = 90, 181, 128 again at 2^16 steps (are the facts
                    stored there set by the parameters or by the step budget?)
A dry run (--dry-run) has the same pieces at tiny sizes, under results/dry_run/.

    python -m analyses.capacity.protocol pieces [--dry-run]      one line per piece, for gpu_run.sh
    python -m analyses.capacity.protocol combine [--dry-run] [--results DIR]   fig4_left.csv and .png

A piece's own tables are the transformer CLI's: `python -m analyses.capacity transformer` with
its shapes and flags, --out its folder and --recorded-only.
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDER = "capacity/paper_fig4_left_full"  # under the results folder
IMPORTED = "imported_"  # a folder of results imported from a GPU record whose cells were not kept
LADDER = "2e16_"
D = (8, 11, 16, 22, 32, 45, 64, 90, 128, 181)
ALPHAS = (4, 2, 1, 0.5, 0.25)


@dataclass(frozen=True)
class Piece:
    """A step of gpu_run.sh: `shapes` searched with `flags` (of `python -m analyses.capacity
    transformer`, --shape, --out and --device aside) into the sweep folder `folder`."""

    name: str
    folder: str
    shapes: tuple[str, ...]
    flags: tuple[str, ...]

    def argv(self, results: Path, device: str) -> list[str]:
        """The transformer CLI's arguments for every shape of the piece."""
        return ["transformer", *(f for s in self.shapes for f in ("--shape", s)), *self.flags,
                "--out", str(protocol_folder(results) / self.folder), "--device", device]


def results_root(dry: bool) -> Path:
    """Where the GPU runs record their results: results/, or results/dry_run/ for a dry run."""
    return ROOT / "results" / ("dry_run" if dry else "")


def protocol_folder(results: Path) -> Path:
    return Path(results) / FOLDER


def pieces(dry: bool = False) -> list[Piece]:
    """Every piece, in the order a GPU runs them (the 2^16-step ones last)."""
    if dry:
        common = ("--answers", "2", "--seq-len", "4", "--lr", "0.03", "--steps", "60", "--eval-every", "20",
                  "--eval-size", "64", "--batch-size", "64")
        lead, lead_flags = "1,1,2", ("--seeds", "0,1", "--probes", "2", "--fill-rounds")
        brackets = {"d11": (11, 2, 5)}
        rows = {"1": ("1,1,2,8",), "2": ("2,2,2",)}
        row_flags, parts, ladder = ("--min-size", "2", "--max-size", "5", "--give-up", "milestones"), \
            {"": (8,), "_large": (8, 11)}, ("--steps", "120")
    else:
        common = ("--answers", "8", "--seq-len", "32", "--eval-size", "1024")
        lead, lead_flags = "1,1,8", ("--seeds", "0,1,2", "--probes", "5", "--fill-rounds")
        # around the S* of the line fitted to the recorded sizes (59, 107 at d = 90, 181:
        # analyses.capacity.plan.Oracle.stand_in) and, at d = 128, the H100 record's 74
        brackets = {"d90": (90, 44, 77), "d181": (181, 80, 140), "d128": (128, 66, 88)}
        rows = {f"{a:g}": tuple(f"{a:g},{b:g},8" + (",64" if a == b == 1 else "") for b in ALPHAS) for a in ALPHAS}
        row_flags, parts, ladder = ("--seed", "0", "--give-up", "milestones"), \
            {"": D[:4], "_mid": D[:7], "_large": D}, ("--steps", "65536")
    common += ("--sampler", "counter", "--quiet")

    def bracket(name, d, low, high, extra=()):
        flags = (*common, *lead_flags, "--d", str(d), "--min-size", str(low), "--max-size", str(high), *extra)
        return Piece(name, name, (lead,), flags)

    found = [bracket(name, *b) for name, b in brackets.items()]
    for a, shapes in rows.items():
        for part, d in parts.items():  # each shape with a size among d (alpha = 0.25 has none below d = 32)
            fitting = tuple(s for s in shapes if any(fits(s, size) for size in d))
            if fitting:
                found.append(Piece(f"alpha{a}{part}", f"alpha{a}", fitting,
                                   (*common, *row_flags, "--d", ",".join(map(str, d)))))
    return found + [bracket(LADDER + name, *b, extra=ladder) for name, b in brackets.items()]


def fits(shape: str, d: int) -> bool:
    """Whether the shape "alpha,beta,H[,largest d]" has a model at size d: d_h = floor(alpha d / H)
    and m = floor(beta d) at least 1, d at most its largest (models.recall.config.shape_model's rule)."""
    alpha, beta, heads, *largest = map(float, shape.split(","))
    return int(alpha * d / heads) >= 1 and int(beta * d) >= 1 and d <= (largest[0] if largest else math.inf)


def combined(results: Path):
    """Every piece's sizes so far (the 2^16-step ones aside: their own tables), one row per
    shape and d with the folder it came from (`piece`); a size imported from a GPU record
    only where no piece has searched it. A DataFrame."""
    import pandas as pd  # here, not above: listing the pieces imports nothing heavy

    folder = protocol_folder(results)
    tables = [pd.read_csv(p).assign(piece=p.parent.name) for p in sorted(folder.glob("*/capacity.csv"))
              if not p.parent.name.startswith(LADDER)]
    tables = [t for t in tables if len(t)]
    if not tables:
        return pd.DataFrame()
    table = pd.concat(tables, ignore_index=True)
    imported = table["piece"].str.startswith(IMPORTED)
    searched = set(zip(table.loc[~imported, "shape"], table.loc[~imported, "d"]))
    keep = ~imported | ~pd.Series(list(zip(table["shape"], table["d"]))).isin(searched)
    return table[keep].reset_index(drop=True)


def write_combined(results: Path):
    """fig4_left.csv and fig4_left.png (facts stored against parameters) of every piece so far."""
    from analyses.capacity.common import fitted_slope
    from analyses.capacity.figures import facts_figure
    from analyses.capacity.transformer import TransformerSweep
    from analyses.sweeps.output import write_csv

    table = combined(results)
    if len(table):
        folder = protocol_folder(results)
        write_csv(folder / "fig4_left.csv", table)
        stored = table[table["facts"] > 0]
        if len(stored):
            facts_figure(stored, fitted_slope(stored["parameters"], stored["facts"]), TransformerSweep(),
                         folder / "fig4_left.png")  # no slope line where the fit is undetermined
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser("python -m analyses.capacity.protocol", description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("pieces", "combine"))
    p.add_argument("--dry-run", action="store_true", help="the dry run's pieces (tiny sizes, results/dry_run/)")
    p.add_argument("--results", type=Path, default=None, help="the results folder (default results/, or "
                                                                "results/dry_run/ with --dry-run)")
    args = p.parse_args(argv)
    if args.command == "pieces":
        for q in pieces(args.dry_run):
            print("\t".join((q.name, q.folder, " ".join(q.shapes), " ".join(q.flags))))
    else:
        write_combined(args.results or results_root(args.dry_run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
