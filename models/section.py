"""The typed description of a model: the config.json `model` section (docs/checkpoint_format.md)
as one frozen dataclass, ModelSection, for every model family.

It is what the configs write (`checkpoint_section`), what a checkpoint reader checks
(`from_json`), and what the weights' shapes (`shapes`: the HookedTransformer state-dict keys
every family's checkpoint holds, ATTN and MLP their prefixes), the parameter counts and the
TransformerBridge are derived from. A factual-recall model has L = n_layers blocks (1 to
MAX_LAYERS), each an attention layer and an MLP; the induction family's models, of one or two
layers with layer norm, are described by InductionSection (below).
"""
from __future__ import annotations

from dataclasses import dataclass

REQUIRED = ("n_layers", "d_model", "n_heads", "d_head", "n_ctx", "d_vocab", "d_vocab_out",
            "act_fn", "normalization_type")
ATTENTIONS = ("softmax", "linear")
HEAD_LAYOUTS = ("standard", "dana")
MAX_LAYERS = 4  # the deepest factual-recall model (n_layers 1 .. MAX_LAYERS)
ATTN = "blocks.0.attn."  # the weights' key prefixes (HookedTransformer state-dict keys): the attention layer
MLP = "blocks.0.mlp."  # and the MLP (of the first block; attn(l) and mlp(l) name block l's)
BIASES = (ATTN + "b_Q", ATTN + "b_K", ATTN + "b_V", ATTN + "b_O", MLP + "b_in", MLP + "b_out")


def attn(layer: int) -> str:
    """Block `layer`'s attention key prefix: 'blocks.1.attn.'."""
    return f"blocks.{layer}.attn."


def mlp(layer: int) -> str:
    """Block `layer`'s MLP key prefix: 'blocks.1.mlp.'."""
    return f"blocks.{layer}.mlp."


def in_layer(key: str, layer: int) -> str:
    """A first-block key (ATTN + 'W_Q') moved to block `layer` ('blocks.2.attn.W_Q'); others as they are."""
    return key.replace("blocks.0.", f"blocks.{layer}.", 1) if key.startswith("blocks.0.") else key


def n_layers_of(weights: dict) -> int:
    """How many blocks a weights dict (or a stack) holds: 1 + the highest `blocks.l.` index."""
    return 1 + max(int(key.split(".")[1]) for key in weights if key.startswith("blocks."))


def _positive(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 1


@dataclass(frozen=True)
class ModelSection:
    """A model of `n_layers` blocks (attention, then an MLP unless attn_only) without layer norm,
    in TransformerLens field names. `attention` is always written; `parameterisation` only when
    not "standard", `positional_embedding` only for the attention-only family ("trainable"),
    `head_layout` and `d_embed` only for its dana layout."""

    d_model: int
    n_heads: int
    d_head: int
    d_mlp: int | None  # None when attention-only
    attn_only: bool
    act_fn: str
    n_ctx: int
    d_vocab: int
    d_vocab_out: int
    attention: str = "softmax"
    parameterisation: str = "standard"
    positional_embedding: str | None = None
    head_layout: str = "standard"
    d_embed: int | None = None  # the dana layout's d (d_model = d_embed + d_head)
    n_layers: int = 1  # L, the blocks (attention, MLP) one after the other

    @property
    def dana(self) -> bool:
        return self.head_layout == "dana"

    @property
    def mlp_width(self) -> int:
        """m, 0 when attention-only."""
        return 0 if self.attn_only else self.d_mlp

    @property
    def shape(self) -> str:
        """The model's size as text: 'd=32 H=4 d_h=8 m=64', '... d_h=8, attention only', and
        'L=2 d=32 ...' for more than one layer."""
        return f"L={self.n_layers} " * (self.n_layers > 1) + f"d={self.d_model} H={self.n_heads} d_h={self.d_head}" + (
            ", attention only" if self.attn_only else f" m={self.d_mlp}")

    def to_json(self) -> dict:
        """The config.json `model` section, keys in the order the format page shows."""
        data = {"n_layers": self.n_layers, "d_model": self.d_model, "n_heads": self.n_heads, "d_head": self.d_head,
                "d_mlp": self.d_mlp, "attn_only": self.attn_only, "act_fn": self.act_fn,
                "normalization_type": None, "n_ctx": self.n_ctx, "d_vocab": self.d_vocab,
                "d_vocab_out": self.d_vocab_out, "attention": self.attention}
        if self.parameterisation != "standard":
            data["parameterisation"] = self.parameterisation
        if self.positional_embedding is not None:
            data["positional_embedding"] = self.positional_embedding
        if self.dana:
            data.update({"head_layout": self.head_layout, "d_embed": self.d_embed})
        return data

    @classmethod
    def from_json(cls, data: dict) -> ModelSection:
        """A config.json `model` section, checked (unknown keys ignored); a ValueError names
        the first problem in one line. The factual-recall family's MLP is ReLU; the
        attention-only family (trainable positions) may use GELU."""
        missing = [k for k in REQUIRED if k not in data]
        if missing:
            raise ValueError(f"model section lacks {', '.join(missing)}.")
        for k in ("d_model", "n_heads", "d_head", "n_ctx", "d_vocab", "d_vocab_out"):
            if not _positive(data[k]):
                raise ValueError(f"model.{k} must be a positive integer, got {data[k]!r}.")
        if not _positive(data["n_layers"]) or data["n_layers"] > MAX_LAYERS:
            raise ValueError(f"model.n_layers must be an integer from 1 to {MAX_LAYERS}, got {data['n_layers']!r}.")
        if data["n_layers"] > 1 and (data.get("positional_embedding") is not None
                                     or data.get("head_layout", "standard") != "standard"):
            raise ValueError(f"model.n_layers is {data['n_layers']}; the attention-only family's models have "
                             "one layer.")
        if data["normalization_type"] is not None:
            raise ValueError(f"model.normalization_type must be null (no layer norm), "
                             f"got {data['normalization_type']!r}.")
        act_fns = ("relu", "gelu") if data.get("positional_embedding") == "trainable" else ("relu",)
        if data["act_fn"] not in act_fns:
            raise ValueError(f"model.act_fn must be {' or '.join(map(repr, act_fns))}, got {data['act_fn']!r}.")
        attention = data.get("attention", "softmax")
        if attention not in ATTENTIONS:
            raise ValueError(f"model.attention must be 'softmax' or 'linear', got {attention!r}.")
        attn_only = bool(data.get("attn_only", False))
        if not attn_only and not _positive(data.get("d_mlp")):
            raise ValueError(f"model.d_mlp must be a positive integer unless attn_only, got {data.get('d_mlp')!r}.")
        layout = data.get("head_layout", "standard")
        if layout not in HEAD_LAYOUTS:
            raise ValueError(f"head_layout must be one of {', '.join(HEAD_LAYOUTS)}, got {layout!r}.")
        if layout == "dana":
            d = data.get("d_embed")
            if not _positive(d):
                raise ValueError(f"model.d_embed must be a positive integer in the dana layout, got {d!r}.")
            if data["d_model"] != d + data["d_head"]:
                raise ValueError(f"a dana-layout model has d_model = d_embed + d_head, got {data['d_model']} "
                                 f"with d_embed {d} and d_head {data['d_head']}.")
        return cls(d_model=data["d_model"], n_heads=data["n_heads"], d_head=data["d_head"],
                   d_mlp=None if attn_only else data["d_mlp"], attn_only=attn_only, act_fn=data["act_fn"],
                   n_ctx=data["n_ctx"], d_vocab=data["d_vocab"], d_vocab_out=data["d_vocab_out"],
                   attention=attention, parameterisation=data.get("parameterisation", "standard"),
                   positional_embedding=data.get("positional_embedding"), head_layout=layout,
                   d_embed=data["d_embed"] if layout == "dana" else None, n_layers=data["n_layers"])


def one_layer(n_layers: int, where, tool: str) -> None:
    """Refuse (one-line ValueError) a model of more than one layer in a tool that reads one layer only."""
    if n_layers != 1:
        raise ValueError(f"{where}: a model of {n_layers} layers; {tool} reads one-layer models only.")


def shapes(section: ModelSection) -> dict[str, tuple[int, ...]]:
    """Checkpoint key -> shape for a model section: the embeddings, block 0's weights (the
    one-layer model's keys, in the same order), the unembedding, then blocks 1 .. L-1's."""
    d, H, dh = section.d_model, section.n_heads, section.d_head
    V, O, T = section.d_vocab, section.d_vocab_out, section.n_ctx
    block = {
        ATTN + "W_Q": (H, d, dh), ATTN + "W_K": (H, d, dh), ATTN + "W_V": (H, d, dh),
        ATTN + "b_Q": (H, dh), ATTN + "b_K": (H, dh), ATTN + "b_V": (H, dh),
        ATTN + "W_O": (H, dh, d), ATTN + "b_O": (d,),
    }
    if not section.attn_only:
        m = section.d_mlp
        block.update({MLP + "W_in": (d, m), MLP + "b_in": (m,), MLP + "W_out": (m, d), MLP + "b_out": (d,)})
    out = {"embed.W_E": (V, d), "pos_embed.W_pos": (T, d), **{k: s for k, s in block.items() if k.startswith(ATTN)},
           "unembed.W_U": (d, O), "unembed.b_U": (O,), **{k: s for k, s in block.items() if k.startswith(MLP)}}
    for layer in range(1, section.n_layers):
        out.update({in_layer(k, layer): s for k, s in block.items()})
    return out


# --------------------------------------------------------------------------- the induction family
# What an induction-family checkpoint says its model is (Bietti et al. 2023; models/induction/):
# n_layers layers (1 or 2), an optional layer norm (TransformerLens "LN": before attention, before
# the MLP, before the unembedding), and an MLP in every layer or in the last one only (mlp_layers
# "last": the simplified model's final MLP; TransformerLens has one MLP shape for all layers, so the
# first layer's MLP is there with zero weights and writes nothing).
ARCHITECTURES = ("simplified", "generic")
MLP_LAYERS = ("none", "all", "last")
EPS = 1e-5  # layer norm's epsilon, TransformerLens's and the authors' (nn.LayerNorm(dim, eps=1e-5))


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
