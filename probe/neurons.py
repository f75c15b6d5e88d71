"""The MLP unit by unit: which hidden units fire on a prompt, and how much each writes
onto the answer's logit at the last position (its direct write: activation times the
unit's output direction read by the unembedding, W_out[k] . W_U[:, a], in logits)."""
from __future__ import annotations

import torch

from probe.hooks import HOOK_MLP_POST


def unit_writes(model, tokens: torch.Tensor, answers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(activations [n, T, m]: the hidden units at every position (hook_post); direct [n, m]:
    each unit's write onto logit(answers) per unit of activation, W_out[k] . W_U[:, a], in
    logits). activations[:, -1] * direct is each unit's write onto the answer at the last
    position; summed over units, the MLP's direct write onto the answer logit less its
    output bias's."""
    with torch.inference_mode():
        _, cache = model.run_with_cache(tokens, names_filter=lambda name: name == HOOK_MLP_POST)
        post = cache[HOOK_MLP_POST]  # [n, T, m]
        return post, (model.W_out[0] @ model.W_U)[:, answers.to(post.device)].T  # [n, m]


def top_units(writes: torch.Tensor, k: int) -> list[int]:
    """The `k` units (at most m) whose largest |write| over the prompts [n, m] is largest, in that order."""
    strongest = writes.abs().amax(0)  # [m]
    return strongest.topk(min(k, len(strongest))).indices.tolist()
