"""Frozen configs of the factual-recall family: what a model is and how it is trained, a run
(TaskConfig, ModelConfig, TrainConfig = RunConfig), and the Figure 4 left shape family
(`shape_model`); the named presets and `preset` are models/recall/presets.py, the attention-only
family's configs models/aot/config.py.

Every field carries its help text, so `python -m models.train --help` documents it and a
flag `--field-name` overrides it (see models/cli.py).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from models.cli import setting
from models.recall import parameterisation as param
from models.section import MAX_LAYERS, ModelSection
from models.training.graphed import CUDA_GRAPH_HELP, CUDA_GRAPH_MODES
from tasks.factual_recall import FactualRecallTask
from tasks.two_hop import TwoHopTask, vocab_sizes

SAMPLERS = ("generator", "counter")
GIVE_UP = ("never", "milestones")
# (fraction of the steps, held-out accuracy a run that reaches 99% has reached by then): validated
# on every recorded Figure 4 left curve (python -m analyses.capacity plan, docs/capacity.md), all
# of them runs of 16,384 steps at d <= 64; a shorter run is still learning at its milestones
MILESTONES = ((0.25, 0.80), (0.5, 0.90), (0.75, 0.95))
MILESTONES_STEPS = (16384,)  # the step budgets of the recorded curves
MILESTONES_MAX_D = 64  # the largest d with recorded curves


@dataclass(frozen=True)
class TaskConfig:
    n_subjects: int = setting(16, "S, number of subjects")
    n_relations: int = setting(4, "R, number of relations")
    answers_per_relation: int = setting(4, "D, answers per relation (|A_r|)")
    n_noise: int = setting(16, "N, number of noise tokens")
    seq_len: int = setting(12, "T, sequence length (= n_ctx), EOS included")
    subject_zipf: float = setting(0.0, "Zipf exponent of subject frequencies (0 = uniform)")
    relation_zipf: float = setting(0.0, "Zipf exponent of relation frequencies (0 = uniform)")
    facts: str = setting("random", "fact table: random | structured", choices=("random", "structured"))
    fact_seed: int = setting(0, "seed of the random fact table")

    @property
    def d_vocab(self) -> int:
        """Input ids S + R + N + 1, as the built task's (its sizes, read without building it)."""
        return self.n_subjects + self.n_relations + self.n_noise + 1

    @property
    def d_vocab_out(self) -> int:
        """Answer ids R * D, as the built task's."""
        return self.n_relations * self.answers_per_relation

    def build(self) -> FactualRecallTask:
        return FactualRecallTask(self.n_subjects, self.n_relations, self.answers_per_relation,
                                 self.n_noise, self.seq_len, self.subject_zipf,
                                 self.relation_zipf, facts=self.facts, fact_seed=self.fact_seed)


@dataclass(frozen=True)
class HopsConfig:
    """The two-hop options (flags of models.train); a one-hop run records none of them."""

    hops: int = setting(1, "relations per prompt: 1 (factual recall) | 2 (two-hop recall, the answer r2(r1(s)) with "
                        "entity-valued relations: tasks/two_hop.py; needs --n-layers >= 2)")
    held_out_compositions: float = setting(0.2, "with --hops 2: share of the compositions (s, r1, r2) never drawn as "
                                           "two-hop prompts in training (their one-hop facts are)")
    one_hop_share: float = setting(0.5, "with --hops 2: share of the training prompts that are one-hop")


@dataclass(frozen=True)
class TwoHopTaskConfig(TaskConfig):
    """A two-hop task (tasks.two_hop.TwoHopTask): S entities, R relations, N noise, T; the
    answers are entities, so answers_per_relation, the Zipf exponents and `facts` are unused."""

    hops: int = 2
    held_out_compositions: float = 0.2
    one_hop_share: float = 0.5

    @property
    def d_vocab(self) -> int:
        return vocab_sizes(self.n_subjects, self.n_relations, self.n_noise)[0]

    @property
    def d_vocab_out(self) -> int:
        return vocab_sizes(self.n_subjects, self.n_relations, self.n_noise)[1]

    def build(self) -> TwoHopTask:
        if self.hops != 2:
            raise ValueError(f"hops must be 1 or 2, got {self.hops!r}.")
        if self.subject_zipf or self.relation_zipf or self.facts != "random":
            raise ValueError("two-hop prompts draw uniform subjects and relations from a random fact table: "
                             "drop --subject-zipf, --relation-zipf and --facts.")
        return TwoHopTask(self.n_subjects, self.n_relations, self.n_noise, self.seq_len, self.held_out_compositions,
                          self.one_hop_share, fact_seed=self.fact_seed)


def with_hops(task: TaskConfig, hops: dict) -> TaskConfig:
    """`task` as the hops options given (HopsConfig's fields set on the command line) make it:
    itself at one hop, a TwoHopTaskConfig at two; other values refused in one line."""
    n = hops.get("hops", 1)
    if isinstance(n, bool) or n not in (1, 2):
        raise ValueError(f"hops must be 1 or 2, got {n!r}.")
    if n == 1:
        if len(hops) > ("hops" in hops):
            raise ValueError(f"--{next(k for k in hops if k != 'hops').replace('_', '-')} is an option of --hops 2.")
        return task
    return TwoHopTaskConfig(**asdict(task), **hops)


@dataclass(frozen=True)
class ModelConfig:
    d_model: int = setting(32, "d, embedding dimension")
    n_heads: int = setting(4, "H, number of attention heads")
    d_head: int = setting(8, "d_h, head dimension")
    d_mlp: int = setting(64, "m, MLP width")
    n_layers: int = setting(1, f"L, number of layers (each attention, then the MLP), 1 to {MAX_LAYERS}")
    attn_only: bool = setting(False, "no MLP: facts can only be stored in the attention OV circuit")
    attention: str = setting("softmax", "softmax | linear (pattern = scaled scores)", choices=("softmax", "linear"))
    parameterisation: str = setting("standard", param.HELP + " (docs/training.md)")
    embedding: str = setting("auto", "frozen embeddings/unembeddings: auto (gaussian where the parameterisation "
                             "takes the authors' embedding, sphere otherwise) | sphere (random, unit norm) | gaussian "
                             "(random, N(0, 1/d) entries) | onehot (orthogonal: d = d_vocab + d_vocab_out, tokens and "
                             "answers on their own axes)",
                             choices=("auto", "sphere", "gaussian", "onehot"))
    readout: str = setting("unembed", "unembed (the residual stream read through the frozen random answer unembedding) "
                           "| direct (the last d_vocab_out axes are the answers' own and the tokens' random embeddings "
                           "fill the first d_model - d_vocab_out: the attention's output matrix writes straight to the "
                           "answer logits, as in the paper's Figure 5; --embedding onehot always reads directly)",
                           choices=("unembed", "direct"))
    attention_weights: str = setting("factored", "factored (train W_Q, W_K, W_V, W_O) | merged (the paper's "
                                     "non-factorised key-query and output-value matrices: W_Q = sqrt(d_head) I and "
                                     "W_V = I frozen, d_head = d)",
                                     choices=("factored", "merged"))
    init: str = setting("normal", "initial trainable weights: normal (std init_scale/sqrt(fan_in)) | constant "
                        "(every entry init_scale)",
                        choices=("normal", "constant"))
    init_scale: float = setting(1.0, "scale of the trainable weights' initialisation (see --init)")

    @property
    def departures(self) -> frozenset[str]:
        """The authors' departures from the standard model this one takes (models/recall/parameterisation.py)."""
        return param.departures(self.parameterisation)

    def resolved(self) -> ModelConfig:
        """This config with `embedding: auto` replaced by what it means for the parameterisation."""
        if self.embedding != "auto":
            return self
        return replace(self, embedding="gaussian" if "embedding" in self.departures else "sphere")

    def recorded(self) -> dict:
        """The fields as a sweep's settings.json records them: resolved, and `parameterisation`
        left out when standard (the value of every sweep recorded before it existed), so those
        sweeps resume."""
        fields_ = asdict(self.resolved())
        if self.parameterisation == "standard":
            fields_.pop("parameterisation")
        if self.n_layers == 1:  # likewise for one layer, the only depth before depth was a setting
            fields_.pop("n_layers")
        return fields_

    def validate(self) -> None:
        param.departures(self.parameterisation)  # refuses a malformed one in one line
        if self.parameterisation != "standard":  # the departures are defined on the default model only
            options = {"embedding": ("auto", "sphere", "gaussian"), "readout": ("unembed",),
                       "attention_weights": ("factored",), "init": ("normal",), "attention": ("softmax",)}
            for name, allowed in options.items():
                if getattr(self, name) not in allowed:
                    raise ValueError(f"the parameterisation {self.parameterisation!r} takes {name} "
                                     f"{' or '.join(allowed)}, got {getattr(self, name)!r}.")
        if isinstance(self.n_layers, bool) or not isinstance(self.n_layers, int) or \
                not 1 <= self.n_layers <= MAX_LAYERS:
            raise ValueError(f"n_layers must be an integer from 1 to {MAX_LAYERS}, got {self.n_layers!r}.")
        for name in ("d_model", "n_heads", "d_head") + (() if self.attn_only else ("d_mlp",)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
        if not self.init_scale >= 0:
            raise ValueError(f"init_scale must be >= 0, got {self.init_scale!r}.")

    def for_task(self, task: FactualRecallTask | TaskConfig) -> ModelConfig:
        """The sizes the task (built, or its config) and the options imply: one-hot embeddings
        set d = d_vocab + d_vocab_out, merged attention weights set d_head = d."""
        cfg = self.resolved()
        if cfg.embedding == "onehot":
            cfg = replace(cfg, d_model=task.d_vocab + task.d_vocab_out)
        elif cfg.readout == "direct" and cfg.d_model <= task.d_vocab_out:
            raise ValueError(f"readout 'direct' keeps the last d_vocab_out = {task.d_vocab_out} axes for the answers; "
                             f"d_model must exceed it, got {cfg.d_model}.")
        if cfg.attention_weights == "merged":
            cfg = replace(cfg, d_head=cfg.d_model)
        return cfg

    def checkpoint_section(self, task: FactualRecallTask | TaskConfig) -> ModelSection:
        """The `model` section of config.json for `task` (built, or its config), validated."""
        cfg = self.for_task(task)
        cfg.validate()
        if getattr(task, "hops", 1) > 1 and cfg.n_layers < 2:
            raise ValueError(f"two-hop prompts need --n-layers 2 or more (one layer cannot compose), "
                             f"got {cfg.n_layers}.")
        return ModelSection(cfg.d_model, cfg.n_heads, cfg.d_head, None if cfg.attn_only else cfg.d_mlp,
                            cfg.attn_only, "relu", task.seq_len, task.d_vocab, task.d_vocab_out,
                            cfg.attention, cfg.parameterisation, n_layers=cfg.n_layers)


@dataclass(frozen=True)
class TrainConfig:
    lr: tuple[float, ...] = setting((1e-2,), "learning rate(s); a comma list trains one model per value at once")
    seed: tuple[int, ...] = setting((0,), "seed(s) of initialisation and data; a comma list trains one model per seed")
    optimizer: str = setting("adam", "adam | sgd (plain gradient descent)", choices=("adam", "sgd"))
    batch_size: int = setting(1024, "fresh samples per step (population loss)")
    steps: int = setting(3000, "maximum number of steps")
    eval_every: int = setting(50, "evaluate on the held-out set every this many steps")
    eval_size: int = setting(4096, "held-out prompts per evaluation")
    target_accuracy: float = setting(0.99, "stop once the best model reaches this held-out accuracy (> 1: never)")
    give_up: str = setting("never", "never | milestones (also stop, as unable to reach target_accuracy, once the best "
                           "held-out accuracy so far of every model is below 0.8, 0.9, 0.95 at 1/4, 1/2, 3/4 of the "
                           "steps: docs/capacity.md)", choices=GIVE_UP)
    snapshots_per_octave: int = setting(2, "log-spaced weight snapshots per doubling of the step (0: none)")
    freeze_ov: bool = setting(False, "keep W_V, b_V, W_O, b_O at their random init: facts must go to the MLP")
    device: str = setting("auto", "auto (CUDA when present) | cpu | cuda | cuda:N")
    sampler: str = setting("counter", "training data: counter (a hash of seed, step, row and column: every seed's "
                           "batch in one call, the same alone or stacked, on a CPU or a GPU, and replayable in a "
                           "CUDA graph) | generator (one torch.Generator per seed, drawn in turn: runs recorded "
                           "before the counter sampler was the default)", choices=SAMPLERS)
    cuda_graph: str = setting("auto", CUDA_GRAPH_HELP, choices=CUDA_GRAPH_MODES)

    def gives_up(self, step: int, best_accuracy: float) -> bool:
        """Whether the milestone rule (give_up = milestones) stops a run at `step`: the best
        held-out accuracy so far, over its models and evaluations, is below a milestone's
        accuracy at or after its fraction of the steps."""
        return self.missed_milestone(step, best_accuracy) is not None

    def missed_milestone(self, step: int, best_accuracy: float) -> tuple[float, float] | None:
        """The first milestone (fraction of the steps, accuracy) the best held-out accuracy so
        far is below at `step`, when the milestone rule is on; else None."""
        if self.give_up != "milestones":
            return None
        return next(((fraction, accuracy) for fraction, accuracy in MILESTONES
                     if step >= fraction * self.steps and best_accuracy < accuracy), None)

    def stopped_by(self, steps_run: int, accuracy: float) -> str:
        """Why a run ended (config.json's `stopped_by`): its best model's accuracy reached the
        target, the milestone rule gave up (the only other stop before the budget), or the budget ran out."""
        if accuracy >= self.target_accuracy:
            return f"target accuracy at step {steps_run}"
        if steps_run < self.steps:
            return f"milestones at step {steps_run}"
        return f"step budget at step {steps_run}"

    def milestones_warning(self, d_model: int | None = None) -> str | None:
        """One line when the milestone rule is on outside the runs it was validated on (16,384
        steps, d <= 64; d unchecked when None: a capacity sweep turns the rule off above it):
        there it may stop a run that would reach its target. None otherwise."""
        outside = ([f"{self.steps:,} steps"] if self.steps not in MILESTONES_STEPS else []) + \
                  ([f"d = {d_model}"] if d_model is not None and d_model > MILESTONES_MAX_D else [])
        if self.give_up != "milestones" or not outside:
            return None
        return (f"warning: --give-up milestones was validated on runs of {MILESTONES_STEPS[0]:,} steps at d <= "
                f"{MILESTONES_MAX_D} only (docs/capacity.md); at {' and '.join(outside)} it may stop a run that "
                "would reach its target")

    @property
    def runs(self) -> list[tuple[float, int]]:
        """The K (lr, seed) pairs trained together, seed-major."""
        return [(lr, seed) for seed in self.seed for lr in self.lr]

    def validate(self) -> None:
        if not self.lr or any(not lr > 0 for lr in self.lr):
            raise ValueError(f"learning rates must be > 0, got {self.lr}.")
        if not self.seed or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in self.seed):
            raise ValueError(f"seeds must be integers >= 0, got {','.join(map(str, self.seed))}.")
        for name in ("lr", "seed"):  # a value twice would train the same model twice
            values = getattr(self, name)
            if len(set(values)) < len(values):
                raise ValueError(f"{name} lists a value twice ({','.join(f'{v:g}' for v in values)}): "
                                 "list each once.")
        for name in ("batch_size", "steps", "eval_every", "eval_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        if self.snapshots_per_octave < 0:
            raise ValueError("snapshots_per_octave must be >= 0.")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {', '.join(SAMPLERS)}, got {self.sampler!r}.")
        if self.give_up not in GIVE_UP:
            raise ValueError(f"give_up must be one of {', '.join(GIVE_UP)}, got {self.give_up!r}.")
        if self.cuda_graph not in CUDA_GRAPH_MODES:
            raise ValueError(f"cuda_graph must be one of {', '.join(CUDA_GRAPH_MODES)}, got {self.cuda_graph!r}.")
        if math.isnan(self.target_accuracy):
            raise ValueError("target_accuracy must be a number (> 1: never stop early), got nan.")


@dataclass(frozen=True)
class RunConfig:
    task: TaskConfig = TaskConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()


def resolved_record(model: ModelConfig) -> dict:
    """The resolved model config as config.json's training.model_config records it (n_layers left
    out at one layer, as in run_record)."""
    record = asdict(model.resolved())
    if model.n_layers == 1:
        record.pop("n_layers")
    return record


def run_record(run: RunConfig) -> dict:
    """`run` as a dict (run.json, a stack's fingerprint): asdict, with the model's n_layers left
    out at one layer, so a one-layer run is recorded as it was before depth was a setting."""
    record = asdict(run)
    if run.model.n_layers == 1:
        record["model"].pop("n_layers")
    return record


def shape_model(alpha: float, beta: float, n_heads: float, d_model: float,
                parameterisation: str = "authors") -> ModelConfig:
    """A model of shape (alpha = H*d_h/d, beta = m/d, H) at embedding size d (paper Fig. 4),
    the authors' parameterisation unless told otherwise. d_h and m are rounded down, as the
    authors' code does (int(d*alpha/H), int(d*beta)): the paper's sizes d = int(2^k), k = 3,
    3.5, ..., rarely divide evenly. H and d are whole numbers >= 1 (2.0 reads as 2)."""
    for name, value in (("H (heads)", n_heads), ("d", d_model)):
        if isinstance(value, bool) or not value >= 1 or value != int(value):
            raise ValueError(f"shape alpha={alpha:g}, beta={beta:g}, H={n_heads:g}: {name} must be a whole number "
                             f">= 1, got {value:g}.")
    n_heads, d_model = int(n_heads), int(d_model)
    d_head, d_mlp = math.floor(alpha * d_model / n_heads), math.floor(beta * d_model)
    if d_head < 1 or d_mlp < 1:
        raise ValueError(f"shape alpha={alpha:g}, beta={beta:g}, H={n_heads} gives d_head={d_head}, "
                         f"d_mlp={d_mlp} at d={d_model} (rounded down); both must be >= 1.")
    return ModelConfig(d_model=d_model, n_heads=n_heads, d_head=d_head, d_mlp=d_mlp, parameterisation=parameterisation)
