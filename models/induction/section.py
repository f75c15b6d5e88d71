"""What an induction-family checkpoint says its model is: the config.json `model` section as one
frozen dataclass (InductionSection), with the HookedTransformer weight shapes and the
TransformerBridge config derived from it.

Unlike the one-layer families' ModelSection, the model has `n_layers` layers (1 or 2), an
optional layer norm (TransformerLens "LN": before attention, before the MLP, before the
unembedding), and an MLP in every layer or in the last one only (`mlp_layers` = "last": the
simplified model's final MLP; TransformerLens has one MLP shape for all layers, so the first
layer's MLP is there with zero weights and writes nothing).
"""
from __future__ import annotations

from dataclasses import dataclass

ARCHITECTURES = ("simplified", "generic")
MLP_LAYERS = ("none", "all", "last")
EPS = 1e-5  # layer norm's epsilon, TransformerLens's and the authors' (nn.LayerNorm(dim, eps=1e-5))


def _positive(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 1


@dataclass(frozen=True)
class InductionSection:
    """An induction-family model in TransformerLens field names."""

    architecture: str  # simplified (the authors' frozen-embedding two-layer model) | generic
    n_layers: int
    d_model: int
    n_heads: int
    d_head: int
    d_mlp: int | None  # None when no layer has an MLP
    mlp_layers: str  # none | all | last
    normalization_type: str | None  # None | "LN"
    n_ctx: int
    d_vocab: int
    d_vocab_out: int
    act_fn: str = "relu"
    attention: str = "softmax"  # read by models.bridge (no linear attention in this family)

    @property
    def attn_only(self) -> bool:
        return self.mlp_layers == "none"

    @property
    def shape(self) -> str:
        """The model's size as text: '2 layers, d=64 H=1 d_h=64, MLP m=256 in the last layer, LN'."""
        where = "every" if self.mlp_layers == "all" else "the last"
        mlp = "no MLP" if self.attn_only else f"MLP m={self.d_mlp} in {where} layer"
        return (f"{self.n_layers} layer{'s' * (self.n_layers > 1)}, d={self.d_model} H={self.n_heads} "
                f"d_h={self.d_head}, {mlp}" + (", LN" if self.normalization_type else ""))

    def mlp_in(self, layer: int) -> bool:
        """Whether `layer` has a working MLP (a zero one stands in TransformerLens's for the others)."""
        return self.mlp_layers == "all" or (self.mlp_layers == "last" and layer == self.n_layers - 1)

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Checkpoint key (HookedTransformer format) -> shape."""
        d, H, dh, m = self.d_model, self.n_heads, self.d_head, self.d_mlp
        out = {"embed.W_E": (self.d_vocab, d), "pos_embed.W_pos": (self.n_ctx, d)}
        for l in range(self.n_layers):
            b = f"blocks.{l}."
            if self.normalization_type:
                out.update({b + "ln1.w": (d,), b + "ln1.b": (d,)})
            out.update({b + "attn.W_Q": (H, d, dh), b + "attn.W_K": (H, d, dh), b + "attn.W_V": (H, d, dh),
                        b + "attn.b_Q": (H, dh), b + "attn.b_K": (H, dh), b + "attn.b_V": (H, dh),
                        b + "attn.W_O": (H, dh, d), b + "attn.b_O": (d,)})
            if not self.attn_only:
                if self.normalization_type:
                    out.update({b + "ln2.w": (d,), b + "ln2.b": (d,)})
                out.update({b + "mlp.W_in": (d, m), b + "mlp.b_in": (m,), b + "mlp.W_out": (m, d),
                            b + "mlp.b_out": (d,)})
        if self.normalization_type:
            out.update({"ln_final.w": (d,), "ln_final.b": (d,)})
        out.update({"unembed.W_U": (d, self.d_vocab_out), "unembed.b_U": (self.d_vocab_out,)})
        return out

    def bridge_config(self):
        """The TransformerBridgeConfig of this model (models.bridge.build_bridge)."""
        from transformer_lens.config import TransformerBridgeConfig

        return TransformerBridgeConfig(
            n_layers=self.n_layers, d_model=self.d_model, n_heads=self.n_heads, d_head=self.d_head,
            d_mlp=self.d_mlp, d_vocab=self.d_vocab, d_vocab_out=self.d_vocab_out, n_ctx=self.n_ctx,
            act_fn=self.act_fn, normalization_type=self.normalization_type, attn_only=self.attn_only,
            init_weights=False, positional_embedding_type="standard", eps=EPS)

    def to_json(self) -> dict:
        return {"family": "induction", "architecture": self.architecture, "n_layers": self.n_layers,
                "d_model": self.d_model, "n_heads": self.n_heads, "d_head": self.d_head, "d_mlp": self.d_mlp,
                "mlp_layers": self.mlp_layers, "attn_only": self.attn_only, "act_fn": self.act_fn,
                "normalization_type": self.normalization_type, "n_ctx": self.n_ctx, "d_vocab": self.d_vocab,
                "d_vocab_out": self.d_vocab_out, "attention": self.attention}

    @classmethod
    def from_json(cls, data: dict) -> InductionSection:
        """A config.json `model` section, checked; a ValueError names the first problem in one line."""
        missing = [k for k in ("architecture", "n_layers", "d_model", "n_heads", "d_head", "mlp_layers",
                               "normalization_type", "n_ctx", "d_vocab", "d_vocab_out") if k not in data]
        if missing:
            raise ValueError(f"model section lacks {', '.join(missing)}.")
        if data["architecture"] not in ARCHITECTURES:
            raise ValueError(f"model.architecture must be one of {', '.join(ARCHITECTURES)}, "
                             f"got {data['architecture']!r}.")
        for k in ("n_layers", "d_model", "n_heads", "d_head", "n_ctx", "d_vocab", "d_vocab_out"):
            if not _positive(data[k]):
                raise ValueError(f"model.{k} must be a positive integer, got {data[k]!r}.")
        if data["n_layers"] > 2:
            raise ValueError(f"model.n_layers is {data['n_layers']}; this family has one or two layers.")
        if data["mlp_layers"] not in MLP_LAYERS:
            raise ValueError(f"model.mlp_layers must be one of {', '.join(MLP_LAYERS)}, got {data['mlp_layers']!r}.")
        if data["mlp_layers"] != "none" and not _positive(data.get("d_mlp")):
            raise ValueError(f"model.d_mlp must be a positive integer with an MLP, got {data.get('d_mlp')!r}.")
        if data["normalization_type"] not in (None, "LN"):
            raise ValueError(f"model.normalization_type must be null or 'LN', got {data['normalization_type']!r}.")
        if data.get("act_fn", "relu") not in ("relu", "gelu"):
            raise ValueError(f"model.act_fn must be 'relu' or 'gelu', got {data.get('act_fn')!r}.")
        return cls(data["architecture"], data["n_layers"], data["d_model"], data["n_heads"], data["d_head"],
                   None if data["mlp_layers"] == "none" else data["d_mlp"], data["mlp_layers"],
                   data["normalization_type"], data["n_ctx"], data["d_vocab"], data["d_vocab_out"],
                   data.get("act_fn", "relu"))
