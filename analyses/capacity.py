"""python -m analyses.capacity memory|transformer : how many associations / facts fit?

memory       For each size, binary-search the largest number N* of associations an
             associative memory (models/memories.py) stores at >= 99% accuracy (best over
             training), per seed. Linear memories: N* against d (theory ~ d^2 up to a log);
             low-rank linear (--m = rank) and MLP memories (--m = width): N* against m*d.
transformer  For each shape (alpha = H*d_h/d, beta = m/d, H) and each d, binary-search the
             largest S = R (D fixed) a one-layer transformer learns to >= 99% held-out
             accuracy, the learning rates trained as one batched run; facts stored S*R
             against the parameter count 4*H*d_h*d + 2*m*d (paper Figure 4 left).

Both fit the log-log slope (summary.json `fitted_slope`) and write, to --out: cells/ (one
JSON per probe: a re-run with the same settings skips what is recorded), probes.csv,
capacity.csv (one row per size and seed), summary.json and a figure with the theory lines.
The searches run concurrently, each probe a cell: in this process (--executor local) or as
Ray tasks (--executor ray: one worker per core, or a cluster with --ray-address).
"""
from __future__ import annotations

import argparse
import math
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd
from analyses.executors import add_executor_flags, check_executor_flags, open_executor
from analyses.output import save_figure, write_csv, write_summary
from analyses.sweep import Cell, Cells, bisection, run_jobs, search
from models.bridge import resolve_device
from models.cli import _comma_list, run_cli
from models.config import RunConfig, TaskConfig, TrainConfig, shape_model
from models.memories import KINDS, MemoryConfig, fit
from models.trainer import train
from models.weights import parameter_count

TARGET = 0.99


def fitted_slope(x, y) -> float:
    """Least-squares slope of log y against log x."""
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)[0])


# ------------------------------------------------------------------------ memories
def memory_capacity(cfg: MemoryConfig, seed: int, device: str):
    """The search for N* of one memory size and seed (a job of analyses.sweep): the largest
    N stored at >= 99% (relative tolerance 5%)."""
    start = max(2, cfg.theory // (4 * max(1, round(math.log(cfg.theory)))))
    return search(bisection(start, lowest=2, rel_tol=0.05),
                  lambda n: Cell(f"{cfg.kind}_d{cfg.d}_m{cfg.m}_seed{seed}_N{n}", memory_row, (cfg, n, seed, device)),
                  lambda row: row["accuracy"] >= cfg.target_accuracy)


def memory_row(cfg: MemoryConfig, n: int, seed: int, device: str) -> dict:
    """One probe: `cfg` fitted to n associations with `seed` (device resolved where it runs)."""
    result = fit(cfg, n, [seed], resolve_device(device))
    return {"kind": cfg.kind, "d": cfg.d, "m": cfg.m, "seed": seed, "n": n,
            "accuracy": result["accuracy"][0], "steps_run": result["steps_run"]}


def run_memory(args) -> dict:
    device = resolve_device(args.device)
    widths = args.m or (None,)
    if args.kind == "mlp" and args.m is None:
        raise ValueError("--kind mlp needs --m (the widths).")
    configs = [MemoryConfig(kind=args.kind, d=d, m=m, embedding=args.embedding, steps=args.steps, lr=args.lr,
                            outputs_per_input=args.outputs_per_input) for d in args.d for m in widths]
    for cfg in configs:
        cfg.validate()
    # what every probe shares; sizes and seeds are in the cell keys, so a sweep can grow
    settings = {"analysis": "capacity memory", **{k: v for k, v in asdict(configs[0]).items() if k not in ("d", "m")}}
    cells = Cells(args.out, settings)
    searches = [(cfg, seed) for cfg in configs for seed in range(args.seeds)]
    with open_executor(args) as executor:
        found = run_jobs([memory_capacity(cfg, seed, args.device) for cfg, seed in searches], cells, executor,
                         desc="memory probes", progress=not args.quiet)
    rows = [{"kind": cfg.kind, "d": cfg.d, "m": cfg.m, "seed": seed, "n_star": n_star, "parameters": cfg.parameters,
             "theory": cfg.theory, "n_star_over_theory": n_star / cfg.theory}
            for (cfg, seed), n_star in zip(searches, found)]
    table = pd.DataFrame(rows)
    full = args.kind == "linear" and args.m is None
    x_name = "d" if full else "m*d"
    table["x"] = table["d"] if full else table["m"] * table["d"]
    means = table.groupby(["d", "m"], dropna=False).agg(x=("x", "first"), n_star=("n_star", "mean"),
                                                        n_star_std=("n_star", "std"), theory=("theory", "first"))
    means = means.reset_index()
    slope = fitted_slope(means["x"], means["n_star"]) if means["x"].nunique() > 1 else float("nan")
    summary = {"kind": args.kind, "x": x_name, "fitted_slope": slope,
               "theory_slope": 2.0 if full else 1.0,
               "sizes": [{"d": int(r.d), "m": None if pd.isna(r.m) else int(r.m), "x": int(r.x),
                          "n_star_mean": float(r.n_star), "n_star_std": float(r.n_star_std) if r.n_star_std == r.n_star_std else None,
                          "n_star_over_theory": float(r.n_star / r.theory)} for r in means.itertuples()],
               "settings": settings, "seeds": args.seeds, "device": str(device), "probes_computed": cells.computed}
    write_csv(args.out / "probes.csv", pd.DataFrame(cells.rows()))
    write_csv(args.out / "capacity.csv", table)
    write_summary(args.out / "summary.json", summary)
    _capacity_figure(means, table, x_name, 2.0 if full else 1.0, slope,
                     f"{args.kind} memory" + ("" if full else (" (rank m)" if args.kind == "linear" else " (width m)")),
                     "associations stored N*", args.out / f"capacity_{args.kind}.png")
    lines = [(f"{args.kind} memory: fitted slope of log N* against log {x_name}: {slope:.2f} "
              f"(theory {summary['theory_slope']:.0f}, up to a log factor)")]
    lines += [f"  d={s['d']:<4} m={s['m']}  N*={s['n_star_mean']:.1f}  N*/{'d^2' if full else 'md'}={s['n_star_over_theory']:.3f}"
              for s in summary["sizes"]]
    print("\n".join(lines + [f"wrote {args.out}/ ({cells.computed} new probes)"]))
    return summary


def _capacity_figure(means, table, x_name, theory_slope, slope, title, ylabel, path, bound=None):
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4))
    ax.scatter(table["x"], table["n_star"], s=10, alpha=0.4, color="gray", label="one seed")
    ax.errorbar(means["x"], means["n_star"], yerr=means["n_star_std"].fillna(0), fmt="o", color="C0",
                label="mean over seeds")
    x = np.geomspace(means["x"].min(), means["x"].max(), 50)
    anchor_x, anchor_y = np.exp(np.log(means["x"]).mean()), np.exp(np.log(means["n_star"]).mean())
    if not math.isnan(slope):
        ax.plot(x, anchor_y * (x / anchor_x) ** slope, "C0-", lw=1, label=f"fit: slope {slope:.2f}")
    ax.plot(x, anchor_y * (x / anchor_x) ** theory_slope, "k--", lw=1, label=f"theory ∝ {x_name}" + ("²" if theory_slope == 2 else ""))
    if theory_slope == 2:  # d^2 / log(d^2)
        ax.plot(x, anchor_y * (x / anchor_x) ** 2 * np.log(anchor_x ** 2) / np.log(x ** 2), "k:", lw=1,
                label="theory ∝ d² / log d²")
    if bound is not None:
        ax.plot(*bound(x), "r-.", lw=1, label="information bound")
    ax.set(xscale="log", yscale="log", xlabel=x_name, ylabel=ylabel, title=title)
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.legend(fontsize=7)
    save_figure(fig, path)


# --------------------------------------------------------------------- transformers
def transformer_run(shape: tuple, d: int, S: int, args) -> RunConfig:
    """The paper's task at S = R (N = S + R noise tokens) and the shape's model at size d;
    the learning rates as one batched run."""
    alpha, beta, heads = shape
    task = TaskConfig(n_subjects=S, n_relations=S, answers_per_relation=args.answers, n_noise=2 * S,
                      seq_len=args.seq_len)
    return RunConfig(task=task, model=shape_model(alpha, beta, int(heads), d),
                     train=TrainConfig(lr=tuple(args.lr), seed=(args.seed,), steps=args.steps, batch_size=args.batch_size,
                                       eval_every=args.eval_every, eval_size=args.eval_size,
                                       target_accuracy=TARGET, snapshots_per_octave=0, device=args.device))


def transformer_capacity(shape: tuple, d: int, args):
    """The search for the largest S = R learned to >= 99% by the shape at size d (a job of
    analyses.sweep)."""
    model = shape_model(*shape[:2], int(shape[2]), d)
    start = max(2, int(math.sqrt(parameter_count(_section(model))["total"] / 16)))
    return search(bisection(start, lowest=2, grow=1.5, rel_tol=0.1),
                  lambda S: Cell(f"shape{shape[0]:g},{shape[1]:g},{shape[2]:g}_d{d}_S{S}", transformer_row,
                                 (shape, d, S, args)),
                  lambda row: row["accuracy"] >= TARGET)


def _section(model) -> dict:
    return {"d_model": model.d_model, "n_heads": model.n_heads, "d_head": model.d_head, "d_mlp": model.d_mlp}


def transformer_row(shape, d, S, args) -> dict:
    """One probe: the shape at size d trained on S = R."""
    result = train(transformer_run(shape, d, S, args), progress=False)
    t = result.training
    return {"alpha": shape[0], "beta": shape[1], "heads": shape[2], "d": d, "S": S, "facts": S * S,
            "accuracy": t["final_accuracy"], "lr": t["lr"], "steps_run": t["steps_run"],
            "seconds": t["seconds"], "parameters": parameter_count(result.model)["total"]}


def run_transformer(args) -> dict:
    shapes = args.shape or [(1.0, 1.0, 2.0)]
    for shape in shapes:
        for d in args.d:
            shape_model(shape[0], shape[1], int(shape[2]), d)  # refuses a shape that does not fit d
    resolve_device(args.device)
    settings = {"analysis": "capacity transformer", "answers": args.answers, "seq_len": args.seq_len,
                "lr": list(args.lr), "seed": args.seed, "steps": args.steps, "batch_size": args.batch_size,
                "eval_every": args.eval_every, "eval_size": args.eval_size}
    cells = Cells(args.out, settings)
    searches = [(shape, d) for shape in shapes for d in args.d]
    with open_executor(args) as executor:
        found = run_jobs([transformer_capacity(shape, d, args) for shape, d in searches], cells, executor,
                         desc="transformer probes", progress=not args.quiet)
    rows = []
    for (shape, d), S in zip(searches, found):
        params = parameter_count(_section(shape_model(shape[0], shape[1], int(shape[2]), d)))["total"]
        rows.append({"shape": ",".join(f"{v:g}" for v in shape), "d": d, "S_star": S, "facts": S * S,
                     "parameters": params, "facts_per_parameter": S * S / params})
    table = pd.DataFrame(rows)
    ok = table[table["facts"] > 0]
    slope = fitted_slope(ok["parameters"], ok["facts"]) if ok["parameters"].nunique() > 1 else float("nan")
    per_shape = {shape: {"fitted_slope": fitted_slope(g["parameters"], g["facts"]) if len(g) > 1 else None,
                         "rows": g.drop(columns="shape").to_dict("records")}
                 for shape, g in ok.groupby("shape")}
    summary = {"fitted_slope": slope, "shapes": per_shape, "bits_per_parameter": args.bits_per_parameter,
               "bits_per_fact": math.log2(args.answers), "settings": settings,
               "sizes": {"shapes": [list(s) for s in shapes], "d": list(args.d)}, "probes_computed": cells.computed}
    write_csv(args.out / "probes.csv", pd.DataFrame(cells.rows()))
    write_csv(args.out / "capacity.csv", table)
    write_summary(args.out / "summary.json", summary)
    _facts_figure(table, slope, args, args.out / "facts_vs_parameters.png")
    lines = [f"facts stored against parameters: fitted slope {slope:.2f} (theory 1)"]
    lines += [f"  shape {r.shape}  d={r.d:<4} S*=R*={r.S_star:<4} facts={r.facts:<6} parameters={r.parameters:<7} "
              f"facts/parameter={r.facts_per_parameter:.3f}" for r in table.itertuples()]
    print("\n".join(lines + [f"wrote {args.out}/ ({cells.computed} new training runs)"]))
    return summary


def _facts_figure(table, slope, args, path):
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4))
    for k, (shape, g) in enumerate(table.groupby("shape")):
        ax.plot(g["parameters"], g["facts"], "o-", color=f"C{k}", label=f"shape (α, β, H) = ({shape})")
    x = np.geomspace(table["parameters"].min(), table["parameters"].max(), 50)
    ok = table[table["facts"] > 0]
    anchor_x, anchor_y = np.exp(np.log(ok["parameters"]).mean()), np.exp(np.log(ok["facts"]).mean())
    if not math.isnan(slope):
        ax.plot(x, anchor_y * (x / anchor_x) ** slope, "k-", lw=1, label=f"fit: slope {slope:.2f}")
    bits = args.bits_per_parameter
    ax.plot(x, bits * x / math.log2(args.answers), "r-.", lw=1,
            label=f"information bound: S·R·log2 D bits at {bits:g} bits/parameter")
    ax.set(xscale="log", yscale="log", xlabel="parameters (4·H·d_h·d + 2·m·d)", ylabel="facts stored (S·R)",
           title="Facts stored against parameters")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.legend(fontsize=7)
    save_figure(fig, path)


# ----------------------------------------------------------------------------- CLI
def _shape(text: str) -> tuple:
    values = _comma_list(float)(text)
    if len(values) != 3:
        raise argparse.ArgumentTypeError(f"a shape is ALPHA,BETA,H, got {text!r}")
    return values


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m analyses.capacity", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("memory", help="associative-memory capacity N* against size (Figure 1)")
    m.add_argument("--kind", choices=KINDS, default="linear", help="linear (full, or low rank with --m) | mlp")
    m.add_argument("--d", type=_comma_list(int), default=(8, 16, 32), help="embedding dimensions (default 8,16,32)")
    m.add_argument("--m", type=_comma_list(int), default=None, help="linear: ranks (default full); mlp: widths")
    m.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per size (default 3; the paper 5)")
    m.add_argument("--steps", type=int, default=2000, help="maximum Adam steps per fit (default 2000; the paper 2^15)")
    m.add_argument("--lr", type=float, default=0.1, help="Adam learning rate (default 0.1)")
    m.add_argument("--embedding", choices=("sphere", "gaussian"), default="sphere")
    m.add_argument("--outputs-per-input", type=float, default=1.0, help="M/N: 1 = injective f (default)")
    t = sub.add_parser("transformer", help="facts stored against parameters across shapes (Figure 4 left)")
    t.add_argument("--shape", type=_shape, action="append", help="ALPHA,BETA,H; repeat for several shapes (default 1,1,2)")
    t.add_argument("--d", type=_comma_list(int), default=(8, 16), help="embedding dimensions (default 8,16)")
    t.add_argument("--answers", type=int, default=8, help="D, answers per relation (default 8)")
    t.add_argument("--seq-len", type=int, default=32, help="T (default 32)")
    t.add_argument("--lr", type=_comma_list(float), default=(1e-3, 3e-3, 1e-2), help="learning rates, one batched run")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--steps", type=int, default=16384, help="maximum steps per run (default 2^14)")
    t.add_argument("--batch-size", type=int, default=1024, help="fresh prompts per step (default 1024)")
    t.add_argument("--eval-every", type=int, default=128)
    t.add_argument("--eval-size", type=int, default=4096)
    t.add_argument("--bits-per-parameter", type=float, default=2.0,
                   help="bits per parameter of the information-bound line (default 2)")
    for q in (m, t):
        q.add_argument("--out", type=Path, required=True, help="output directory (resumable)")
        q.add_argument("--device", default="auto", help="auto (CUDA when present) | cpu | cuda | cuda:N")
        q.add_argument("--quiet", action="store_true", help="no progress bar")
        add_executor_flags(q)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    check_executor_flags(args)
    if args.command == "memory":
        if args.seeds < 1 or args.steps < 1 or min(args.d) < 1:
            raise ValueError("--seeds, --steps and --d must be >= 1.")
        run_memory(args)
    else:
        if args.answers < 2 or args.seq_len < 3 or min(args.steps, args.batch_size, args.eval_every, args.eval_size, *args.d) < 1:
            raise ValueError("--answers must be >= 2, --seq-len >= 3, --steps, --batch-size, --eval-every, --eval-size and --d >= 1.")
        run_transformer(args)
    return 0


if __name__ == "__main__":
    run_cli(main)
