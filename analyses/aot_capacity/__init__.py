"""python -m analyses.aot_capacity [--out DIR] : memorisation capacity of one-layer
attention-only transformers (Dana, Pydi & Chevaleyre), on the association task.

Trains, on bigrams over N tokens with a random next token each (T_0 = N^S associations):
  heads    attention-only models, H in --heads at fixed d_h = --d-head, d = --d-model
  d_head   H = --fixed-heads, d_h in --d-heads
  d_model  H = --fixed-heads, d_h = --d-head, d in --d-models
  mlp      one head of d_h = --d-head + a GELU MLP of width m: the same parameter count
           as the attention-only model with H heads (H in --heads, H > 1)
  d_equal  d = d_h in --equal-dims, H in --heads (the paper's Figure 2b; none by default)
in each --head-layout: standard (the paper's equations: every head its own maps from the
d-dimensional stream) and/or dana (the authors' code: one shared d -> d_h compression,
d_h-dimensional positions, one shared d_h -> d decompression; models/aot/weights.py).
Measures the accuracy on all T_0 sequences (the share of associations memorised) and the
authors' accuracy (mean of the last 100 training-batch accuracies, batch_accuracy),
averaged over --seeds. Fits accuracy = a + b H (R^2), and accuracy = a + b d_h^k (the
exponent k), and for d_equal the per-head slope at each d (points up to the first above
0.95, as the authors) and its growth slope ~ d^k, each with a 95% interval, or undetermined
where it has no more points than parameters; draws the lower bound of Corollary 2,
1/N + (1 - 1/N)(H min(d_h, d) + d)/T_0 (the theorem takes d_h <= d), on every axis.
With --distribution-heads it also trains attention-only models on the distribution task
and compares their KL with the rank-d floor. On the heads sweep's models it reads, through
the TransformerBridge hooks, whether each head attends by position or by token.

Writes to DIR: runs.csv (one row per model and seed), capacity.csv (seed means),
heads.csv, head_tokens.csv, summary.json (fit_H_r2, fit_dh_exponent, ...), capacity.png,
head_roles.png, checkpoints/ (every trained model, docs/checkpoint_format.md, task.kind
association or distribution) and cells/ (one JSON file per finished stack of models: a
rerun skips them). Stacks run in this process (--executor local), in --jobs worker
processes of this machine (--executor processes) or as Ray tasks (--executor ray: one
worker per core, or a cluster with --ray-address).
"""
from analyses.aot_capacity.cli import main, parser
from analyses.aot_capacity.sweep import AotSweep, Trained
from analyses.aot_capacity.tables import AotCapacity, tables

__all__ = ["AotSweep", "Trained", "AotCapacity", "tables", "parser", "main"]
