"""Instruments of the induction family (Bietti et al. 2023): functions of a TransformerLens model and
an InductionTask, reading the model through its weights and hooks, returning DataFrames.

- `in_context_scores`: accuracy and loss by kind of position: in-context (a trigger's output from
  its second occurrence, counter >= 2), first output (counter 1), bigram (counter 0); and the
  out-of-distribution test (outputs never used in training).
- `memory_recall`: the authors' memory recall probes, read from the weights: W_KQ^1 (`wk0`: does
  position t's query rank position t-1's key first; `wk0_64` the same over the first 64 positions),
  W_KQ^2 (`wk1`: does a trigger's query rank its own remapped key W_OV^1 e_k first among the
  triggers), W_OV^2 (`wo1`: does u_k^T W_OV^2 e_k rank
  k first), the final MLP (`ff1`: KL(pi_b(.|k) || softmax(W_U MLP(e_k))), nats). With several heads,
  each head's recall, or (`heads="sum"`) the authors' full-width reading: scores summed over heads.
- `head_scores`: each head's previous-token score (share of a query's attention on the position
  before it) and induction score (share on the positions after an earlier occurrence of the
  query's token, at in-context positions), from hook_pattern.
- `knowledge_location`: global against in-context predictions with the MLP ablated, the MLP's
  output matrix truncated to low rank, or the induction head ablated.

The clean batch is drawn once (`clean_batch`) and may be passed to every measurement.
"""
from __future__ import annotations

import pandas as pd
import torch

from tasks.induction import InductionBatch, InductionTask

EVAL_SEED = 4321  # the instruments' held-out sequences (the trainer's are another seed)
EARLY = 64  # wk0_64 reads the previous-token memory of the first EARLY positions (the authors' cutoff)


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def clean_batch(model, task: InductionTask, n: int = 256, seed: int = EVAL_SEED, ood: bool = False) -> InductionBatch:
    """n held-out sequences on the model's device (`ood`: outputs from the held-out quarter)."""
    return task.eval_set(n, seed, model_device(model), ood)


def _position_kinds(counts: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"in_context": counts >= 2, "first_output": counts == 1, "bigram": counts == 0}


def _scores(logits: torch.Tensor, batch: InductionBatch, prefix: str = "") -> list[dict]:
    losses = -logits.log_softmax(-1).gather(-1, batch.targets[..., None])[..., 0]  # [B, T]
    correct = logits.argmax(-1) == batch.targets
    return [{"positions": prefix + name, "accuracy": correct[mask].float().mean().item(),
             "loss": losses[mask].mean().item(), "n": int(mask.sum())}
            for name, mask in _position_kinds(batch.counts).items()]


def in_context_scores(model, task: InductionTask, batch: InductionBatch | None = None, n: int = 256,
                      ood: bool | None = None) -> pd.DataFrame:
    """Accuracy and cross-entropy (nats) by kind of position (in_context, first_output, bigram),
    indexed by `positions`; with `ood` (default: when the task holds outputs out) also the
    out-of-distribution test's rows (ood_in_context, ...)."""
    batch = batch if batch is not None else clean_batch(model, task, n)
    with torch.inference_mode():
        rows = _scores(model(batch.tokens), batch)
        if task.held_out_outputs if ood is None else ood:
            test = clean_batch(model, task, len(batch), ood=True)
            rows += _scores(model(test.tokens), test, "ood_")
    return pd.DataFrame(rows).set_index("positions")


def _recall(scores: torch.Tensor) -> float:
    """R = share of queries i (rows of scores [M, M']) whose best key is key i."""
    return scores.argmax(-1).eq(torch.arange(len(scores), device=scores.device)).float().mean().item()


def _readings(per_head: list[torch.Tensor], heads: str) -> list[tuple[int | None, torch.Tensor]]:
    """(head, scores) of each head, or (None, their sum): the full-width product W_Q^T W_K of all heads."""
    return [(None, sum(per_head))] if heads == "sum" else list(enumerate(per_head))


HEADS = ("each", "sum")  # memory_recall's readings of a layer with several heads


def memory_recall(model, task: InductionTask, heads: str = "each") -> pd.DataFrame:
    """The authors' memory recall probes (wk0, wk1, and wk0_64, wk0 over the first 64 positions, when
    n_ctx > 64; wo1 of the last layer; ff1 of the last layer's MLP), read from the weights (layer
    norms are not applied, as in their code): one row per (probe, layer, head) with its `value` (a
    recall in [0, 1]; ff1 a KL in nats) and what it measures. `heads="each"`: one row per head;
    `"sum"`: the authors' full-model reading, each probe's scores summed over the heads (head None)."""
    if model.cfg.n_layers != 2:
        raise ValueError(f"the memory recall probes read a two-layer model; this one has {model.cfg.n_layers}.")
    if heads not in HEADS:
        raise ValueError(f"heads must be one of {', '.join(HEADS)}, got {heads!r}.")
    with torch.inference_mode():
        W_E, W_pos, W_U, b_U = model.W_E, model.W_pos, model.W_U, model.b_U  # [N, d], [T, d], [d, N], [N]
        W_Q, W_K, W_V, W_O = model.W_Q, model.W_K, model.W_V, model.W_O  # [L, H, d, dh] ... W_O [L, H, dh, d]
        b_Q, b_K = model.b_Q, model.b_K  # [L, H, dh]
        H = W_Q.shape[1]
        fixed = task.triggers == "fixed"
        triggers = task.fixed_triggers.to(W_E.device) if fixed else torch.arange(task.n_tokens, device=W_E.device)
        remapped = sum(W_E[triggers] @ W_V[0, h] @ W_O[0, h] for h in range(H))  # [M, d] e~_k = W_OV^1 e_k
        rows = []
        # position t's query [T-1, dh] (t = 1..T-1) against the keys of positions 0..T-2: t's target is t-1
        previous = [(W_pos[1:] @ W_Q[0, h] + b_Q[0, h]) @ (W_pos[:-1] @ W_K[0, h] + b_K[0, h]).T for h in range(H)]
        for h, scores in _readings(previous, heads):  # [T-1, T-1]
            rows.append(("wk0", 0, h, _recall(scores), "W_KQ^1: position t's query ranks position t-1 first"))
            if len(W_pos) > EARLY:  # the authors' wk0_64: the first 64 positions only
                rows.append(("wk0_64", 0, h, _recall(scores[:EARLY - 1, :EARLY - 1]),
                             f"W_KQ^1 on the first {EARLY} positions (t < {EARLY}) only"))
        # trigger k's query [M, dh] against the remapped keys
        induction = [(W_E[triggers] @ W_Q[1, h] + b_Q[1, h]) @ (remapped @ W_K[1, h] + b_K[1, h]).T for h in range(H)]
        for h, scores in _readings(induction, heads):  # [M, M]
            rows.append(("wk1", 1, h, _recall(scores), "W_KQ^2: trigger k's query ranks its remapped key first"))
        outputs = [W_E @ W_V[1, h] @ W_O[1, h] @ W_U for h in range(H)]  # [N, N] u_j^T W_OV^2 e_k
        for h, logits in _readings(outputs, heads):
            rows.append(("wo1", 1, h, (logits + b_U).argmax(-1).eq(torch.arange(task.n_tokens, device=W_E.device))
                         .float()[:task.n_train_outputs].mean().item(), "W_OV^2: u_k^T W_OV^2 e_k ranks k first"))
        if not model.cfg.attn_only:
            used = [i for i in range(task.n_tokens) if not (fixed and i in task.fixed_triggers.tolist())]
            e = W_E[used]  # [M, d]
            act = torch.relu if model.cfg.act_fn == "relu" else torch.nn.functional.gelu
            out = act(e @ model.W_in[1] + model.b_in[1]) @ model.W_out[1] + model.b_out[1]  # [M, d]
            log_p = (out @ W_U + b_U).log_softmax(-1)
            pi_b = task.conditionals.to(e.device)[used]
            kl = (pi_b * (pi_b.clamp_min(1e-30).log() - log_p)).sum(-1).mean().item()
            rows.append(("ff1", 1, None, kl, "final MLP: KL(pi_b(.|k) || its prediction on e_k), nats"))
    return pd.DataFrame(rows, columns=["probe", "layer", "head", "value", "measures"])


def head_scores(model, task: InductionTask, batch: InductionBatch | None = None, cache=None,
                n: int = 64) -> pd.DataFrame:
    """Each head's `previous_token` score (mean share of a query's attention on the position just
    before it, over queries t >= 1) and `induction` score (mean share on the positions s whose
    previous token is the query's token, over in-context queries: counter >= 2), in [0, 1], one row
    per (layer, head). Reads blocks.{l}.attn.hook_pattern of `cache` (run here when not given)."""
    batch = batch if batch is not None else clean_batch(model, task, n)
    if cache is None:
        with torch.inference_mode():
            _, cache = model.run_with_cache(batch.tokens, names_filter=lambda name: name.endswith("hook_pattern"))
    tokens = batch.tokens  # [B, T]
    T = tokens.shape[-1]
    after = torch.zeros_like(tokens[:, :, None].expand(-1, -1, T), dtype=torch.bool)  # [B, query, key]
    after[:, :, 1:] = tokens[:, None, :-1] == tokens[:, :, None]  # key s follows an occurrence of the query's token
    in_context = batch.counts >= 2  # [B, T]
    rows = []
    for l in range(model.cfg.n_layers):
        pattern = cache[f"blocks.{l}.attn.hook_pattern"]  # [B, H, query, key]
        previous = pattern.diagonal(offset=-1, dim1=-2, dim2=-1).mean((0, -1))  # [H] pattern[t, t-1]
        on_after = (pattern * after[:, None]).sum(-1)  # [B, H, T]
        induction = (on_after * in_context[:, None]).sum((0, -1)) / in_context.sum()  # [H]
        for h in range(pattern.shape[1]):
            rows.append({"layer": l, "head": h, "previous_token": previous[h].item(), "induction": induction[h].item()})
    return pd.DataFrame(rows)


def knowledge_location(model, task: InductionTask, batch: InductionBatch | None = None, ranks=(1, 4, 16),
                       induction_head: tuple[int, int] | None = None, n: int = 256) -> pd.DataFrame:
    """Where global and in-context knowledge live: the model run clean, with its last MLP ablated
    (zero output), with that MLP's output matrix W_out truncated to its top `ranks` singular
    directions, and with the induction head (layer, head; default the last layer's best by
    head_scores) ablated (zero z). Per variant, at in-context positions whose output differs from the
    global bigram's top token: the share predicted `in_context` (the output) and `global` (argmax
    pi_b(.|current token)); the in-context accuracy over all counter >= 2 positions; at bigram
    positions the loss and the KL from pi_b (nats)."""
    batch = batch if batch is not None else clean_batch(model, task, n)
    last = model.cfg.n_layers - 1
    if induction_head is None:
        scores = head_scores(model, task, batch)
        best = scores[scores.layer == last].sort_values("induction").iloc[-1]
        induction_head = (int(best["layer"]), int(best["head"]))
    variants: dict[str, list] = {"clean": []}
    if not model.cfg.attn_only:
        variants["mlp_ablated"] = [(f"blocks.{last}.hook_mlp_out", lambda x, hook: torch.zeros_like(x))]
        W_out, b_out = model.W_out[last].detach(), model.b_out[last].detach()  # [m, d], [d]
        U, S, Vh = torch.linalg.svd(W_out, full_matrices=False)
        store = {}

        def keep_post(x, hook):
            store["post"] = x  # [B, T, m]
        for r in ranks:
            low = (U[:, :r] * S[:r]) @ Vh[:r]  # [m, d] rank r
            variants[f"mlp_rank_{r}"] = [(f"blocks.{last}.mlp.hook_post", keep_post),
                                         (f"blocks.{last}.hook_mlp_out",
                                          lambda x, hook, low=low: store["post"] @ low + b_out)]
    l, h = induction_head

    def zero_head(z, hook, h=h):
        z = z.clone()
        z[:, :, h] = 0.0  # [B, T, H, dh]
        return z
    variants[f"head_{l}.{h}_ablated"] = [(f"blocks.{l}.attn.hook_z", zero_head)]
    pi_b = task.conditionals.to(batch.tokens.device)  # [N, N]
    global_top = pi_b.argmax(-1)[batch.tokens]  # [B, T] the global bigram's answer
    in_context = batch.counts >= 2
    differ = in_context & (global_top != batch.targets)
    bigram = batch.counts == 0
    rows = []
    with torch.inference_mode():
        for name, hooks in variants.items():
            logits = model.run_with_hooks(batch.tokens, fwd_hooks=hooks)  # [B, T, N]
            pred, log_p = logits.argmax(-1), logits.log_softmax(-1)
            target_pi = pi_b[batch.tokens][bigram]  # [P, N]
            kl = (target_pi * (target_pi.clamp_min(1e-30).log() - log_p[bigram])).sum(-1).mean()
            accuracy = (pred == batch.targets)[in_context].float().mean().item()
            rows.append({"variant": name, "in_context_accuracy": accuracy,
                         "in_context": (pred == batch.targets)[differ].float().mean().item(),
                         "global": (pred == global_top)[differ].float().mean().item(),
                         "bigram_loss": -log_p.gather(-1, batch.targets[..., None])[..., 0][bigram].mean().item(),
                         "bigram_kl": kl.item()})
    return pd.DataFrame(rows).set_index("variant")
