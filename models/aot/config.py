"""Frozen configs of the attention-only family (Dana et al.): the model (AoTModelConfig) and
Dana et al.'s training recipe (AoTTrainConfig). Every field carries its help text, so
`python -m analyses.aot_capacity --help` documents it."""
from __future__ import annotations

from dataclasses import dataclass

from models.cli import setting
from models.section import HEAD_LAYOUTS, ModelSection
from models.training.graphed import CUDA_GRAPH_HELP, CUDA_GRAPH_MODES
from tasks.association import SequenceTask


@dataclass(frozen=True)
class AoTModelConfig:
    """A model of the memorisation tasks (Dana et al.): one attention layer with trainable
    embeddings, optionally followed by a GELU MLP; the head layouts are models.aot.weights'."""

    d_model: int = setting(10, "d, embedding dimension")
    n_heads: int = setting(1, "H, number of attention heads")
    d_head: int = setting(10, "d_h, head dimension")
    d_mlp: int = setting(0, "m, MLP width after the heads (0: attention-only)")
    act_fn: str = setting("gelu", "MLP non-linearity (the paper's GELU, or relu)")
    head_layout: str = setting("standard", "standard (the paper's equations) | dana (the authors' code: shared "
                               "d -> d_h compression, d_h-dimensional positions, shared d_h -> d decompression)")

    @property
    def attn_only(self) -> bool:
        return self.d_mlp == 0

    @property
    def dana(self) -> bool:
        return self.head_layout == "dana"

    def validate(self) -> None:
        for name in ("d_model", "n_heads", "d_head"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
        if isinstance(self.d_mlp, bool) or not isinstance(self.d_mlp, int) or self.d_mlp < 0:
            raise ValueError(f"d_mlp must be an integer >= 0, got {self.d_mlp!r}.")
        if self.act_fn not in ("gelu", "relu"):
            raise ValueError(f"act_fn must be 'gelu' or 'relu', got {self.act_fn!r}.")
        if self.head_layout not in HEAD_LAYOUTS:
            raise ValueError(f"head_layout must be one of {', '.join(HEAD_LAYOUTS)}, got {self.head_layout!r}.")

    def checkpoint_section(self, task: SequenceTask) -> ModelSection:
        """The `model` section of config.json for `task`. The dana layout is saved as its
        TransformerLens form: d_model = d + d_h, `d_embed` = d."""
        self.validate()
        return ModelSection(self.d_model + self.d_head if self.dana else self.d_model, self.n_heads, self.d_head,
                            None if self.attn_only else self.d_mlp, self.attn_only, self.act_fn, task.seq_len,
                            task.d_vocab, task.d_vocab_out, positional_embedding="trainable",
                            head_layout=self.head_layout, d_embed=self.d_model if self.dana else None)

    def parameters(self, task: SequenceTask) -> int:
        """Trainable parameters. standard: d(S + 2N) embeddings, 4 H d_h d attention, 2 m d
        MLP. dana: 2 N d embedding and unembedding, S d_h positions, 2 d d_h compression and
        decompression, H (4 d_h^2 + 4 d_h) attention (nn.MultiheadAttention(d_h, 1) with
        biases), 2 m d MLP."""
        d, dh, H = self.d_model, self.d_head, self.n_heads
        if self.dana:
            return 2 * task.n_tokens * d + task.seq_len * dh + 2 * d * dh + H * 4 * dh * (dh + 1) + 2 * self.d_mlp * d
        return d * (task.seq_len + 2 * task.n_tokens) + 4 * H * dh * d + 2 * self.d_mlp * d

    def matched_mlp_width(self, n_heads: int) -> int:
        """MLP width m at which this model with one head + the MLP has as many parameters
        as with `n_heads` heads and no MLP: 2 m d = (n_heads - 1) x (parameters per head),
        rounded (exact for the standard layout, and for dana when d = d_h)."""
        per_head = 4 * self.d_head * (self.d_head + 1) if self.dana else 4 * self.d_head * self.d_model
        return round((n_heads - 1) * per_head / (2 * self.d_model))

    @property
    def name(self) -> str:
        return (f"d{self.d_model}_H{self.n_heads}_dh{self.d_head}" + (f"_m{self.d_mlp}" if self.d_mlp else "")
                + ("_dana" if self.dana else ""))


@dataclass(frozen=True)
class AoTTrainConfig:
    """Dana et al.'s recipe (appendix B): per seed, `batches` batches drawn once, `epochs` passes, Adam."""

    lr: float = setting(1e-3, "Adam learning rate")
    batch_size: int = setting(1024, "sequences per batch")
    batches: int = setting(1000, "batches drawn once per seed (the data set)")
    epochs: int = setting(10, "passes over the data set")
    eval_every: int = setting(500, "score every model on all T_0 sequences every this many steps")
    device: str = setting("auto", "auto (CUDA when present) | cpu | cuda | cuda:N")
    cuda_graph: str = setting("auto", CUDA_GRAPH_HELP, choices=CUDA_GRAPH_MODES)

    @property
    def steps(self) -> int:
        return self.batches * self.epochs

    def validate(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}.")
        for name in ("batch_size", "batches", "epochs", "eval_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}.")
        if self.cuda_graph not in CUDA_GRAPH_MODES:
            raise ValueError(f"cuda_graph must be one of {', '.join(CUDA_GRAPH_MODES)}, got {self.cuda_graph!r}.")
