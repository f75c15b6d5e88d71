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
Memories are also read against the line the paper draws (`authors_line`: N ln N = d^2/1.3
for the linear memory, N ln N = 0.35 m d for the MLP, N = m d / 1.2 for the MLP with M = 32
fixed outputs, --outputs 32): the slope of log(N* ln N*) and N* over the line at every size.
The searches run concurrently, each probe a cell: in this process (--executor local) or as
Ray tasks (--executor ray: one worker per core, or a cluster with --ray-address).
"""
from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from analyses.executors import add_executor_flags, check_executor_flags, open_executor
from analyses.output import pyplot, save_figure, write_csv, write_summary
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
    if args.m is not None and args.m_per_d is not None:
        raise ValueError("give --m or --m-per-d, not both.")
    if args.kind == "mlp" and args.m is None and args.m_per_d is None:
        raise ValueError("--kind mlp needs --m (the widths) or --m-per-d.")
    sizes = [(d, m) for d in args.d for m in (args.m or (None,))] if args.m_per_d is None else \
        [(d, round(a * d)) for d in args.d for a in args.m_per_d]
    configs = [MemoryConfig(kind=args.kind, d=d, m=m, embedding=args.embedding, steps=args.steps, lr=args.lr,
                            outputs_per_input=args.outputs_per_input, n_outputs=args.outputs) for d, m in sizes]
    for cfg in configs:
        cfg.validate()
    # what every probe shares; sizes and seeds are in the cell keys, so a sweep can grow.
    # Fields added after the first sweeps are recorded only when set: those sweeps stay readable.
    settings = {"analysis": "capacity memory", **{k: v for k, v in asdict(configs[0]).items() if k not in ("d", "m")
                                                  and not (k in ("n_outputs", "eval_every") and v == getattr(MemoryConfig, k))}}
    cells = Cells(args.out, settings)
    searches = [(cfg, seed) for cfg in configs for seed in range(args.seeds)]
    with open_executor(args) as executor:
        found = run_jobs([memory_capacity(cfg, seed, args.device) for cfg, seed in searches], cells, executor,
                         desc="memory probes", progress=not args.quiet)
    rows = [{"kind": cfg.kind, "d": cfg.d, "m": cfg.m, "seed": seed, "n_star": n_star, "parameters": cfg.parameters,
             "theory": cfg.theory, "n_star_over_theory": n_star / cfg.theory}
            for (cfg, seed), n_star in zip(searches, found)]
    table = pd.DataFrame(rows)
    summary = memory_report(table, configs[0], args.out, pd.DataFrame(cells.rows()),
                            {"settings": settings, "seeds": args.seeds, "device": str(device),
                             "probes_computed": cells.computed})
    print(f"wrote {args.out}/ ({cells.computed} new probes)")
    return summary


@dataclass(frozen=True)
class AuthorsLine:
    """The reference line the paper draws through a capacity figure: N ln N = c x (or N = c x
    without the log factor), x = d^2 for a full linear memory and m*d otherwise."""
    law: str
    c: float
    log_factor: bool
    setting: str  # the memories the paper drew it for

    def value(self, n):
        """N ln N (or N) for N* = n."""
        n = np.asarray(n, float)
        return n * np.log(n) if self.log_factor else n

    def n_on_line(self, x):
        """N on the line at scale x: N ln N = c x solved by Newton's method."""
        target = self.c * np.asarray(x, float)
        if not self.log_factor:
            return target
        n = np.maximum(target / np.log(np.maximum(target, 3.0)), 1.0)
        for _ in range(30):  # n ln n is convex and increasing for n >= 1: monotone convergence
            n = n - (n * np.log(n) - target) / (np.log(n) + 1)
        return n


def authors_line(cfg: MemoryConfig) -> AuthorsLine | None:
    """The paper's reference line for this memory (Figure 1 and Figure 6), or None."""
    if cfg.kind == "linear" and cfg.m is None:
        return AuthorsLine("N ln N = d²/1.3", 1 / 1.3, True, "full linear memory, f(i) = i (Figure 1 left)")
    if cfg.kind == "mlp" and cfg.n_outputs is not None:
        return AuthorsLine("N = m·d/1.2", 1 / 1.2, False, "MLP memory, M = 32 outputs (Figure 6)")
    if cfg.kind == "mlp" and cfg.outputs_per_input == 1:
        return AuthorsLine("N ln N = 0.35·m·d", 0.35, True, "MLP memory, f(i) = i (Figure 1 right)")
    return None


def memory_report(table: pd.DataFrame, cfg: MemoryConfig, out: Path, probes: pd.DataFrame, extra: dict) -> dict:
    """From one row per (size, seed) with its N*: probes.csv, capacity.csv, summary.json and
    capacity_{kind}.png, and the summary printed. Reports the plain slope of log N* against
    log d (full linear) or log m*d, and the authors' law: the slope of log(N* ln N*) against
    the same (2 and 1 when the law holds) and N* against the paper's line at every size."""
    full = cfg.kind == "linear" and cfg.m is None
    x_name, theory_slope = ("d", 2.0) if full else ("m*d", 1.0)
    table = table.assign(x=table["d"] if full else table["m"] * table["d"])
    means = table.groupby(["d", "m"], dropna=False).agg(x=("x", "first"), n_star=("n_star", "mean"),
                                                        n_star_std=("n_star", "std"), theory=("theory", "first"))
    means = means.reset_index()
    several = means["x"].nunique() > 1
    slope = fitted_slope(means["x"], means["n_star"]) if several else float("nan")
    line = authors_line(cfg)
    sizes = []
    for r in means.itertuples():
        size = {"d": int(r.d), "m": None if pd.isna(r.m) else int(r.m), "x": int(r.x),
                "n_star_mean": float(r.n_star), "n_star_std": float(r.n_star_std) if r.n_star_std == r.n_star_std else None,
                "n_star_over_theory": float(r.n_star / r.theory)}
        if line is not None:
            n_line = float(line.n_on_line(r.theory))
            size.update(n_line=n_line, n_star_over_line=float(r.n_star / n_line))
        sizes.append(size)
    summary = {"kind": cfg.kind, "x": x_name, "fitted_slope": slope, "theory_slope": theory_slope, "authors_line": None,
               "sizes": sizes, **extra}
    if line is not None:
        law_slope = fitted_slope(means["x"], line.value(means["n_star"])) if several else float("nan")
        summary["authors_line"] = {"law": line.law, "setting": line.setting,
                                   "fitted_slope": law_slope, "theory_slope": theory_slope,
                                   "fitted_slope_of": ("log(N* ln N*)" if line.log_factor else "log N*") + f" against log {x_name}"}
    write_csv(out / "probes.csv", probes)
    write_csv(out / "capacity.csv", table)
    write_summary(out / "summary.json", summary)
    kind = cfg.kind + " memory" + ("" if full else (" (rank m)" if cfg.kind == "linear" else " (width m)"))
    if cfg.n_outputs is not None:
        kind += f", M = {cfg.n_outputs} outputs"
    _capacity_figure(means, table, full, slope, line, kind, out / f"capacity_{cfg.kind}.png")
    lines = [f"{kind}: fitted slope of log N* against log {x_name}: {slope:.2f} (theory {theory_slope:.0f}, up to a log factor)"]
    if line is not None:
        a = summary["authors_line"]
        lines.append(f"  the paper's line {line.law}: slope of {a['fitted_slope_of']}: {a['fitted_slope']:.2f} "
                     f"(the law: {theory_slope:.0f})")
    for s in sizes:
        text = f"  d={s['d']:<4} m={s['m']}  N*={s['n_star_mean']:.1f}  N*/{'d^2' if full else 'md'}={s['n_star_over_theory']:.3f}"
        if line is not None:
            text += f"  line N={s['n_line']:.1f}  N*/line={s['n_star_over_line']:.2f}"
        lines.append(text)
    print("\n".join(lines))
    return summary


def _capacity_figure(means, table, full, slope, line, title, path):
    """Left, as the paper plots it: N* against d^2 (full linear) or m*d, with the fit, the
    theory lines and the paper's line. Right: N* over the paper's line (over d^2 or m*d
    when there is none) at every size."""
    import matplotlib.ticker
    plt = pyplot()

    scale_name = "d²" if full else "m·d"  # the `theory` column: the paper's x axis
    fig, (ax, right) = plt.subplots(1, 2, figsize=(10, 4))
    groups, label = [(None, means)], "mean over seeds".format
    if not full and means["m"].nunique() > 1:  # one series per m/d on a grid of d x (m/d), else per m
        ratio = means["m"] / means["d"]
        by_ratio = ratio.groupby(means["d"]).apply(frozenset).nunique() == 1
        groups = means.groupby(ratio if by_ratio else means["m"])
        label = "m = {:g}·d".format if by_ratio else "m = {:g}".format
    ax.scatter(table["theory"], table["n_star"], s=10, alpha=0.4, color="gray", label="one seed")
    for k, (key, g) in enumerate(groups):
        ax.errorbar(g["theory"], g["n_star"], yerr=g["n_star_std"].fillna(0), fmt="o", color=f"C{k}", label=label(key))
        reference = line.n_on_line(g["theory"]) if line is not None else g["theory"]
        right.plot(g["x"], g["n_star"] / reference, "o-", color=f"C{k}", label=label(key))
    x = np.geomspace(means["theory"].min(), means["theory"].max(), 50)
    anchor_x, anchor_y = np.exp(np.log(means["theory"]).mean()), np.exp(np.log(means["n_star"]).mean())
    per_scale = 2.0 if full else 1.0  # x = d (full linear) is the square root of the plotted scale d^2
    if not math.isnan(slope):
        ax.plot(x, anchor_y * (x / anchor_x) ** (slope / per_scale), "C0-", lw=1,
                label=f"fit: N* ∝ {'d' if full else 'm·d'}^{slope:.2f}")
    ax.plot(x, anchor_y * x / anchor_x, "k--", lw=1, label=f"theory ∝ {scale_name}")
    if full:
        ax.plot(x, anchor_y * (x / anchor_x) * np.log(anchor_x) / np.log(x), "k:", lw=1, label="theory ∝ d² / log d²")
    if line is not None:
        ax.plot(x, line.n_on_line(x), "r-.", lw=1.5, label=f"paper: {line.law}")
    ax.set(xscale="log", yscale="log", xlabel=scale_name, ylabel="associations stored N*", title=title)
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.legend(fontsize=7)
    right.axhline(1.0, color="r" if line is not None else "k", ls="-." if line is not None else "--", lw=1)
    right.set(xscale="log", xlabel="d" if full else "m·d",
              ylabel=f"N* / N on the paper's line ({line.law})" if line is not None else f"N* / {scale_name}",
              title="against the paper's line" if line is not None else f"N* / {scale_name}")
    right.set_xticks(sorted(means["x"].unique()))
    right.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    right.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    if len(groups) > 1:
        right.legend(fontsize=7)
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
    import matplotlib.ticker
    plt = pyplot()

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
    m.add_argument("--m-per-d", type=_comma_list(float), default=None,
                   help="sizes m = a*d for each listed a, in place of --m (the paper's MLP widths: 1,2,4,8)")
    m.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per size (default 3; the paper 5)")
    m.add_argument("--steps", type=int, default=2000, help="maximum Adam steps per fit (default 2000; the paper 2^15)")
    m.add_argument("--lr", type=float, default=0.1, help="Adam learning rate (default 0.1)")
    m.add_argument("--embedding", choices=("sphere", "gaussian"), default="sphere")
    m.add_argument("--outputs-per-input", type=float, default=1.0, help="M/N: 1 = injective f (default)")
    m.add_argument("--outputs", type=int, default=None,
                   help="M fixed whatever N (the paper's Figure 6: 32); replaces --outputs-per-input")
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
