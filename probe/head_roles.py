"""Do a memorising head attend by position or by token? Instruments on a TransformerBridge
model of the association / distribution tasks, read through its hooks on all T_0 sequences.

Per head, from the last query's attention pattern (hook_pattern) on every sequence:
- `mass_pos<p>`: mean attention mass on position p (probability; uniform is 1/S);
- `denoising_score`: mean over sequences of (max_p mass - 1/S) / (1 - 1/S): 1 = always all
  attention on one position, 0 = uniform (locate_facts's score, positions for tokens);
- `token_dependence`: mean total-variation distance between a sequence's pattern and the
  head's mean pattern: 0 = the pattern ignores the tokens (a position head), up to 1;
- `var_key_token`, `var_query_token`, `var_interaction`: shares of the variance of the
  mass on position 0 explained by the token at position 0 alone, by the query token
  (last position) alone, and by the rest (their interaction), over the uniform prior;
- `role`: "position" when token_dependence < `threshold`, else "token";
- `mean_ablation_accuracy`: accuracy with this head's output (hook_z, last position)
  replaced by its mean over the sequences, and `accuracy_drop` from the clean accuracy.
"""
from __future__ import annotations

import pandas as pd
import torch

from probe.hooks import HOOK_Z, CleanRun, clean_run, model_device, rerun_last_position, set_last
from tasks.association import SequenceTask

THRESHOLD = 0.1


def sequences_run(model, task: SequenceTask, run: CleanRun | None = None) -> CleanRun:
    """The clean run on all T_0 sequences [T_0, S] of `task`: `run` when given (it must hold
    them), else a new one."""
    return run if run is not None else clean_run(model, task.sequences().to(model_device(model)))


def head_roles(model, task: SequenceTask, threshold: float = THRESHOLD, run: CleanRun | None = None) -> pd.DataFrame:
    """One row per head (see the module docstring), on all T_0 sequences of `task`; `run`:
    the clean run on them (sequences_run), computed here when not given."""
    run = sequences_run(model, task, run)
    pattern = run.pattern.float()  # [T_0, H, S] the last query's attention
    clean = task.scores(run.logits)["accuracy"].item()
    S, N = task.context, task.n_tokens
    mean_pattern = pattern.mean(0)  # [H, S]
    dependence = 0.5 * (pattern - mean_pattern).abs().sum(-1).mean(0)  # [H]
    denoising = ((pattern.amax(-1) - 1 / S) / (1 - 1 / S)).mean(0) if S > 1 else torch.zeros(pattern.shape[1])
    shares = _variance_shares(pattern[..., 0], N, S)  # each [H]
    z_mean = run.z.mean(0)  # [H, d_head]
    rows = []
    for h in range(pattern.shape[1]):
        logits = rerun_last_position(model, run, [(HOOK_Z, set_last(z_mean[h], h))])
        ablated = task.scores(logits)["accuracy"].item()
        rows.append({"head": h, **{f"mass_pos{p}": float(mean_pattern[h, p]) for p in range(S)},
                     "denoising_score": float(denoising[h]), "token_dependence": float(dependence[h]),
                     **{k: float(v[h]) for k, v in shares.items()},
                     "role": "position" if dependence[h] < threshold else "token",
                     "clean_accuracy": clean, "mean_ablation_accuracy": ablated, "accuracy_drop": clean - ablated})
    return pd.DataFrame(rows)


def _variance_shares(mass: torch.Tensor, N: int, S: int) -> dict[str, torch.Tensor]:
    """Variance shares of mass [T_0, H] (sequences in grid order) explained by the first
    token's main effect, the query (last) token's main effect, and the rest."""
    grid = mass.T.reshape(mass.shape[1], *[N] * S)  # [H, N, ..., N]
    centred = grid - grid.mean(tuple(range(1, S + 1)), keepdim=True)
    total = centred.pow(2).mean(tuple(range(1, S + 1))).clamp(min=1e-12)  # [H]
    key = centred.mean(tuple(range(2, S + 1))).pow(2).mean(-1)  # [H] the first token's main effect
    query = centred.mean(tuple(range(1, S))).pow(2).mean(-1) if S > 1 else torch.zeros_like(total)
    key_share, query_share = key / total, query / total
    return {"var_key_token": key_share, "var_query_token": query_share,
            "var_interaction": (1 - key_share - query_share).clamp(min=0)}


def key_token_table(model, task: SequenceTask, run: CleanRun | None = None) -> pd.DataFrame:
    """Mean attention mass [head x token] of the last query on position 0 when it holds
    token t<i> (averaged over the other positions' tokens); columns t0, t1, ... `run`: the
    clean run on the T_0 sequences (sequences_run), computed here when not given."""
    pattern = sequences_run(model, task, run).pattern.float()  # [T_0, H, S]
    H, N = pattern.shape[1], task.n_tokens
    table = pattern[..., 0].T.reshape(H, N, -1).mean(-1).cpu().numpy()  # [H, N] first token is most significant
    return pd.DataFrame(table, columns=[task.token_label(t) for t in range(N)], index=pd.Index(range(H), name="head"))
