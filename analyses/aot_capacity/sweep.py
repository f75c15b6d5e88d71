"""The settings of the sweeps and their cells: every (model, seed) trained in stacks, one
cell per stack."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from analyses.sweeps import cli
from analyses.sweeps.cells import Cell, Cells, one, run_jobs
from analyses.sweeps.executors import ExecutorSettings, open_executor
from models.aot.config import AoTModelConfig, AoTTrainConfig
from models.aot.trainer import train_aot
from models.cli import setting
from tasks.association import AssociationTask, DistributionTask, SequenceTask


def lower_bound(n_heads: int, d_head: int, d_model: int, n_tokens: int, n_sequences: int) -> float:
    """Corollary 2: an AoT can reach accuracy 1/N + (1 - 1/N)(H d_h + d)/T_0 (at most 1),
    for d_h <= d; a head wider than d writes no more than d, so d_h counts as min(d_h, d)."""
    return min(1.0, 1 / n_tokens + (1 - 1 / n_tokens) * (n_heads * min(d_head, d_model) + d_model) / n_sequences)


@dataclass(frozen=True)
class AotSweep:
    """The association task and the models of every sweep (the package docstring)."""

    n_tokens: int = setting(50, "N, vocabulary size")
    context: int = setting(2, "S, sequence length (2: bigrams)")
    table_seed: int = setting(0, "seed of the random next-token table")
    d_model: int = setting(10, "d of the heads, d_head and mlp sweeps")
    d_head: int = setting(10, "d_h of the heads, d_model and mlp sweeps")
    fixed_heads: int = setting(20, "H of the d_head and d_model sweeps")
    heads: tuple[int, ...] = setting((1, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20),
                                     "H values of the heads sweep (and the MLP model's matched sizes)")
    d_heads: tuple[int, ...] = setting((1, 2, 4, 6, 8, 10), "d_h values")
    d_models: tuple[int, ...] = setting((2, 4, 6, 8, 10, 15, 20), "d values")
    equal_dims: tuple[int, ...] = setting((), "d = d_h values of the d_equal sweep, each with H in --heads")
    head_layout: tuple[str, ...] = setting(("standard",), "head layouts trained side by side: standard and/or dana "
                                                          "(the authors' code)")
    distribution_heads: tuple[int, ...] = setting((), "also train attention-only models with these H on the "
                                                      "distribution task")
    concentration: float = setting(1.0, "distribution task: pi_t = softmax(c g_t)")
    seeds: tuple[int, ...] = setting((0, 1), "seeds averaged")
    stack: int = setting(8, "models trained at once in one padded stack")
    skip_instruments: bool = setting(False, "no head-role measurements")
    skip_mlp: bool = setting(False, "no one-head-plus-MLP models (the mlp sweep)")

    def __post_init__(self):
        cli.at_least(self, stack=1)
        cli.require(self, "seeds", len(self.seeds) > 0, "at least one seed")
        self.task()  # a bad task is refused here, before anything is written
        if self.distribution_heads:
            self.distribution_task()
        for models in self.sweep_models().values():
            for m in models:
                m.validate()

    @property
    def layouts(self) -> tuple[str, ...]:
        """Each head layout once, in the order given."""
        return tuple(dict.fromkeys(self.head_layout))

    def sweeps(self, layout: str = "standard") -> dict[str, list[AoTModelConfig]]:
        """The models of each sweep in one head layout (a model may belong to several)."""
        d, dh, H = self.d_model, self.d_head, self.fixed_heads
        base = AoTModelConfig(d, 1, dh, head_layout=layout)
        base.validate()
        return {
            "heads": [AoTModelConfig(d, h, dh, head_layout=layout) for h in self.heads],
            "d_head": [AoTModelConfig(d, H, k, head_layout=layout) for k in self.d_heads],
            "d_model": [AoTModelConfig(k, H, dh, head_layout=layout) for k in self.d_models],
            "mlp": [AoTModelConfig(d, 1, dh, d_mlp=base.matched_mlp_width(h), head_layout=layout)
                    for h in self.heads if h > 1 and not self.skip_mlp],
            "d_equal": [AoTModelConfig(k, h, k, head_layout=layout) for k in self.equal_dims for h in self.heads],
        }

    def sweep_models(self) -> dict[str, list[AoTModelConfig]]:
        """Each sweep's models in every layout."""
        models: dict[str, list[AoTModelConfig]] = {}
        for layout in self.layouts:
            for sweep, some in self.sweeps(layout).items():
                models.setdefault(sweep, []).extend(some)
        return models

    def recorded(self, cfg: AoTTrainConfig) -> dict:
        """settings.json: what every cell's result depends on besides its model and seed (the
        task, the sizes the sweeps hold fixed, the training), so that --out refuses another
        sweep; the value lists (--heads, --seeds, ...) may grow, each cell keyed by its own."""
        fixed = ("n_tokens", "context", "table_seed", "concentration", "d_model", "d_head", "fixed_heads")
        return {"analysis": "aot_capacity", **{name: getattr(self, name) for name in fixed},
                "train": {k: v for k, v in asdict(cfg).items() if k not in ("device", "cuda_graph")}}

    def task(self) -> AssociationTask:
        return AssociationTask(self.n_tokens, self.context, self.table_seed)

    def distribution_task(self) -> DistributionTask:
        return DistributionTask(self.n_tokens, self.context, self.table_seed, self.concentration)


# --------------------------------------------------------------------------- cells
@dataclass
class Trained:
    """Every sweep trained: {(model, seed): record} on the association task, and on the
    distribution task (None without --distribution-heads)."""

    association: dict
    distribution: dict | None


def train_sweeps(sweep: AotSweep, cfg: AoTTrainConfig, out: Path, cells: Cells, executor: ExecutorSettings,
                 progress: bool = True) -> Trained:
    """Train every model of every sweep, each seed (the stacks recorded in out/cells/, the
    models saved in out/checkpoints/)."""
    models = sorted({m for some in sweep.sweep_models().values() for m in some}, key=lambda m: m.name)
    distribution_models = [AoTModelConfig(sweep.d_model, h, sweep.d_head, head_layout=layout)
                           for layout in sweep.layouts for h in sweep.distribution_heads]
    seeds = list(sweep.seeds)
    with open_executor(executor) as running:
        association = train_all(sweep.task(), models, seeds, cfg, out, sweep.stack, cells, running, progress)
        distribution = train_all(sweep.distribution_task(), distribution_models, seeds, cfg, out, sweep.stack, cells,
                                 running, progress) if distribution_models else None
    return Trained(association, distribution)


def _run_key(task: SequenceTask, model: AoTModelConfig, seed: int, cfg: AoTTrainConfig) -> str:
    model_settings = asdict(model)
    if model.head_layout == "standard":  # the keys of runs made before layouts existed
        del model_settings["head_layout"]
    settings = {"task": {k: v for k, v in task.to_config().items() if k != "next_tokens"},
                "model": model_settings, "seed": seed, "train": {k: v for k, v in asdict(cfg).items() if k != "device"}}
    return hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def train_all(task: SequenceTask, models: list[AoTModelConfig], seeds: list[int], cfg: AoTTrainConfig,
              out: Path, stack_size: int, cells: Cells, executor, progress: bool) -> dict[tuple, dict]:
    """Train every (model, seed) in stacks of up to `stack_size` models of similar shape, one
    cell per stack (recorded stacks are skipped). Returns {(model, seed): record}.

    Similar shapes share a stack (a stack costs its largest size along every axis): one bucket
    per (seed, head layout, attention-only or not, d), sorted by H d_h and m, cut into stacks. The stacks
    depend only on the sweep's settings, so a resumed sweep trains the same stacks as an
    uninterrupted one, and adding a seed adds stacks without touching the others."""
    runs = sorted({(m, s) for m in models for s in seeds},
                  key=lambda r: (r[0].d_mlp > 0, r[0].d_model, r[0].n_heads * r[0].d_head, r[0].d_mlp, r[0].name, r[1]))
    buckets: dict[tuple, list] = {}
    for r in runs:
        buckets.setdefault((r[1], r[0].head_layout, r[0].d_mlp > 0, r[0].d_model), []).append(r)
    stacks = [b[i:i + stack_size] for b in buckets.values() for i in range(0, len(b), stack_size)]
    jobs = []
    for stack in stacks:
        keys = [_run_key(task, m, s, cfg) for m, s in stack]
        name = hashlib.sha1("".join(keys).encode()).hexdigest()[:12]
        first, seed = stack[0]
        jobs.append(one(Cell(f"{task.kind}_seed{seed}_{first.head_layout}_d{first.d_model}_{name}", train_stack,
                             (task, stack, cfg, out.resolve()))))
    done = {}
    for result in run_jobs(jobs, cells, executor, desc=f"{task.kind} stacks", total=len(jobs), progress=progress):
        done.update((record["key"], record) for record in result["runs"])
    return {(m, s): done[_run_key(task, m, s, cfg)] for m, s in runs}


def train_stack(task: SequenceTask, stack: list[tuple[AoTModelConfig, int]], cfg: AoTTrainConfig, out: Path) -> dict:
    """One cell: the (model, seed) runs of `stack` trained together, each saved as a checkpoint
    under out/checkpoints/; their records (accuracy, loss, checkpoint path relative to out)."""
    records = []
    for (model, seed), trained in zip(stack, train_aot(task, stack, cfg, progress=False)):
        key = _run_key(task, model, seed, cfg)
        ckpt = out / "checkpoints" / task.kind / f"{model.name}_seed{seed}_{key[:6]}"
        trained.save(ckpt)
        records.append({"key": key, "model": asdict(model), "seed": seed, "accuracy": trained.accuracy,
                        "loss": trained.loss, "batch_accuracy": trained.training["batch_accuracy"],
                        "seconds": trained.metrics[-1]["seconds"], "checkpoint": str(ckpt.relative_to(out))})
    return {"runs": records}
