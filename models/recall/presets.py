"""The named factual-recall presets, and `preset`: a name (or a member of the shape family) ->
its RunConfig."""
from models.recall.config import ModelConfig, RunConfig, TaskConfig, TrainConfig, shape_model

PAPER_TASK = TaskConfig(n_subjects=32, n_relations=32, answers_per_relation=8, n_noise=64, seq_len=32)
_FIG5_TASK = TaskConfig(n_subjects=16, n_relations=4, answers_per_relation=8, n_noise=20, seq_len=32,
                         facts="structured")

PRESETS: dict[str, RunConfig] = {
    # Small enough to reach >= 99% on a CPU in seconds; the default model.
    "tiny": RunConfig(),
    # Figure 4 right's task with a mid-grid model (H = 8, m = 64), the official code's model and lr 1e-2.
    "paper-tradeoff": RunConfig(
        task=PAPER_TASK,
        model=ModelConfig(d_model=32, n_heads=8, d_head=8, d_mlp=64, parameterisation="authors"),
        train=TrainConfig(lr=(1e-2,), steps=16384, eval_every=128)),
    # The benchmark's config A.
    "config-a": RunConfig(
        task=PAPER_TASK,
        model=ModelConfig(d_model=64, n_heads=8, d_head=8, d_mlp=256),
        train=TrainConfig(lr=(1e-2,), steps=16384, eval_every=128)),
    # Figure 5 left (the official code's settings): one linear-attention head on one-hot
    # embeddings writing straight to the answer logits, the paper's merged key-query and
    # output-value matrices with every entry 1e-5, plain gradient descent at lr 0.1.
    # W_Q = sqrt(d_head) I cancels the checkpoint format's 1/sqrt(d_head), so these are the
    # official dynamics exactly. Dense snapshots for analyses.hallucination.
    "fig5-linear": RunConfig(
        task=_FIG5_TASK,
        model=ModelConfig(n_heads=1, attn_only=True, attention="linear", embedding="onehot",
                          attention_weights="merged", init="constant", init_scale=1e-5),
        train=TrainConfig(optimizer="sgd", lr=(0.1,), steps=8192, eval_every=64, eval_size=2048,
                          target_accuracy=2.0, snapshots_per_octave=8)),
    # Figure 5 right as the official code runs it: fig5-linear with the softmax swapped in
    # and random unit-norm token embeddings (d = 128) in place of one-hot ones; the output
    # matrix [d, |A|] still writes straight to the answer logits (--readout direct: the 32
    # answer axes come on top of the 128 token axes).
    "fig5-softmax-gd": RunConfig(
        task=_FIG5_TASK,
        model=ModelConfig(d_model=128 + 32, n_heads=1, attn_only=True, attention="softmax", embedding="sphere",
                          readout="direct", attention_weights="merged", init="constant", init_scale=1e-5),
        train=TrainConfig(optimizer="sgd", lr=(0.1,), steps=8192, eval_every=64, eval_size=2048,
                          target_accuracy=2.0, snapshots_per_octave=8)),
    # Figure 5 right, our variant: one softmax head on frozen random embeddings,
    # TransformerLens factors, Adam. d = 128 (at d = 64 the head stalls near 94% within 8192 steps).
    "fig5-softmax-adam": RunConfig(
        task=_FIG5_TASK,
        model=ModelConfig(d_model=128, n_heads=1, d_head=128, attn_only=True, init_scale=0.1),
        train=TrainConfig(optimizer="adam", lr=(1e-2,), steps=8192, eval_every=64, eval_size=2048,
                          target_accuracy=2.0, snapshots_per_octave=8)),
}


def preset(name: str) -> RunConfig:
    """A named preset, or a shape family member `shape:ALPHA,BETA,H,D` on the paper's task
    with the Figure 4 left learning-rate sweep (the authors' parameterisation)."""
    if name.startswith("shape:"):
        try:
            alpha, beta, heads, d = (float(x) for x in name[len("shape:"):].split(","))
        except ValueError:
            raise ValueError(f"shape preset must read shape:ALPHA,BETA,H,D, got {name!r}.") from None
        return RunConfig(task=PAPER_TASK, model=shape_model(alpha, beta, heads, d),
                         train=TrainConfig(lr=(1e-3, 3e-3, 1e-2), steps=16384, eval_every=128))
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)} or shape:ALPHA,BETA,H,D.")
    return PRESETS[name]
