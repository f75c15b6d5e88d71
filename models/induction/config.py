"""Frozen configs of the induction family (Bietti et al. 2023): the task (InductionTaskConfig), the
model (InductionModelConfig: the authors' simplified two-layer model or a generic one- or
two-layer transformer), the training (InductionTrainConfig: SGD with momentum and weight decay,
or Adam), and the named presets. Every field carries its help text, so
`python -m models.induction.train --help` documents it and `--field-name` overrides it."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from models.cli import setting
from models.section import InductionSection
from tasks.induction import OUTPUTS, TRIGGERS, InductionTask

LOSSES = ("in_context", "all")
OPTIMIZERS = ("sgd", "adam")


@dataclass(frozen=True)
class InductionTaskConfig:
    text: str = setting("shakespeare", "the text whose character bigrams are the global knowledge (tasks/data/)")
    n_triggers: int = setting(5, "K, trigger tokens")
    seq_len: int = setting(256, "T, inputs per sequence (= n_ctx)")
    triggers: str = setting("fixed", "fixed (the K most frequent characters) | random (per sequence, from the "
                            "unigram marginals)", choices=TRIGGERS)
    outputs: str = setting("uniform", "each trigger's output: uniform over the vocabulary | bigram (from pi_b)",
                           choices=OUTPUTS)
    held_out_outputs: bool = setting(False, "train outputs from the first 3/4 of the vocabulary only, so the "
                                     "out-of-distribution test can use the last 1/4")

    def build(self) -> InductionTask:
        return InductionTask(self.text, self.n_triggers, self.seq_len, self.triggers, self.outputs,
                             self.held_out_outputs)


@dataclass(frozen=True)
class InductionModelConfig:
    architecture: str = setting("simplified", "simplified (the authors' model: frozen random embeddings, "
                                "positions, unembedding and W_OV^1, W_Q = I; trained W_KQ^1 = W_K^1, W_KQ^2 = W_K^2, "
                                "W_O^2; two layers, one head) | generic (every weight trained, MLPs in every layer)",
                                choices=("simplified", "generic"))
    n_layers: int = setting(2, "layers (generic: 1 or 2; simplified: 2)")
    d_model: int = setting(256, "d, embedding dimension")
    n_heads: int = setting(1, "heads per layer (simplified: 1; d_head = d / heads)")
    d_mlp: int = setting(0, "MLP width (simplified: the final MLP, 0 none; generic: every layer's, 0 none)")
    layer_norm: bool = setting(False, "pre-norm layer norm (generic only)")

    def validate(self) -> None:
        for name in ("n_layers", "d_model", "n_heads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
        if isinstance(self.d_mlp, bool) or not isinstance(self.d_mlp, int) or self.d_mlp < 0:
            raise ValueError(f"d_mlp must be an integer >= 0, got {self.d_mlp!r}.")
        if self.n_layers > 2:
            raise ValueError(f"n_layers must be 1 or 2, got {self.n_layers}.")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not a multiple of n_heads {self.n_heads}.")
        if self.architecture == "simplified" and (self.n_layers, self.n_heads, self.layer_norm) != (2, 1, False):
            raise ValueError("the simplified model has two layers of one head and no layer norm "
                             "(--architecture generic for other shapes).")

    def section(self, task: InductionTask) -> InductionSection:
        """The config.json `model` section for `task`."""
        self.validate()
        mlp = "none" if not self.d_mlp else "last" if self.architecture == "simplified" else "all"
        return InductionSection(self.architecture, self.n_layers, self.d_model, self.n_heads,
                                self.d_model // self.n_heads, self.d_mlp or None, mlp,
                                "LN" if self.layer_norm else None, task.seq_len, task.d_vocab, task.d_vocab_out)

    @property
    def name(self) -> str:
        return (f"{self.architecture}_L{self.n_layers}_d{self.d_model}_H{self.n_heads}"
                + (f"_m{self.d_mlp}" if self.d_mlp else "") + ("_ln" if self.layer_norm else ""))


@dataclass(frozen=True)
class InductionTrainConfig:
    optimizer: str = setting("sgd", "sgd (with momentum and weight decay, the authors') | adam (AdamW: decoupled "
                             "weight decay)", choices=OPTIMIZERS)
    lr: tuple[float, ...] = setting((0.03,), "learning rates (one model per lr and seed)")
    seed: tuple[int, ...] = setting((0,), "seeds of the initial weights and the data stream")
    momentum: float = setting(0.9, "SGD momentum")
    weight_decay: float = setting(1e-4, "weight decay")
    batch_size: int = setting(512, "fresh sequences per step")
    steps: int = setting(1000, "training steps")
    loss: str = setting("in_context", "in_context (the outputs from their second occurrence, the authors' "
                        "loss_head_only) | all (every next token)", choices=LOSSES)
    eval_every: int = setting(50, "score every model on the held-out set every this many steps")
    eval_size: int = setting(256, "held-out sequences")
    snapshot_every: int = setting(0, "keep the weights every this many steps, for the probes over training (0: none)")
    frozen: tuple[str, ...] = setting((), "weights kept at their initial value (e.g. blocks.0.attn.W_K), for "
                                      "`joint learning is faster`")
    device: str = setting("auto", "auto (CUDA when present) | cpu | cuda | cuda:N")

    @property
    def runs(self) -> list[tuple[float, int]]:
        """(lr, seed) of each of the K models."""
        return list(itertools.product(self.lr, self.seed))

    def validate(self) -> None:
        if not self.lr or any(not lr > 0 for lr in self.lr):
            raise ValueError(f"every lr must be > 0, got {self.lr!r}.")
        if not self.seed:
            raise ValueError("give at least one seed.")
        for name in ("batch_size", "steps", "eval_every", "eval_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}.")
        if self.snapshot_every < 0:
            raise ValueError(f"snapshot_every must be >= 0, got {self.snapshot_every!r}.")
        if not 0 <= self.momentum < 1 or self.weight_decay < 0:
            raise ValueError(f"momentum must be in [0, 1) and weight_decay >= 0, got {self.momentum}, "
                             f"{self.weight_decay}.")


# name -> (task, model, training): `cpu` trains in under two minutes on a 2-core CPU; `paper` is the
# authors' size (d = 256, T = 256, batch 512, 1000 steps of SGD lr 0.03, K = 5 fixed triggers)
PRESETS = {
    "cpu": (InductionTaskConfig(n_triggers=3, seq_len=64), InductionModelConfig(d_model=64),
            InductionTrainConfig(lr=(0.2,), batch_size=64, steps=600, eval_every=25, eval_size=128)),
    "paper": (InductionTaskConfig(), InductionModelConfig(),
              InductionTrainConfig(lr=(0.03,), eval_every=50, eval_size=512)),
}


def preset(name: str) -> tuple[InductionTaskConfig, InductionModelConfig, InductionTrainConfig]:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; the presets are {', '.join(PRESETS)}.")
    return PRESETS[name]
