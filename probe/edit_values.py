"""ROME's v*: the value of a rank-one write found by optimisation (Meng et al. 2022, compute_v),
where the closed form through the unembedding cannot reach it (d_model < R*D, a block below the
last, the subject's position).

delta [d_model] is added to the store's output (hook_mlp_out, or the head's share of
hook_attn_out) at the key's position of the fact's prompts (its noise contexts) and of the same
subject's other facts' prompts (ROME's "essence" prompts), and Adam (lr 0.5) minimises

    -log p(a_new) on the fact's prompts
    + KL_FACTOR * KL(edited || original) on the other prompts' answers (ROME's kl_div direction)
    + WEIGHT_DECAY * ||delta|| / ||original output||^2   (ROME's form),

for STEPS steps (stopping early under STOP), delta's norm clamped to CLAMP times the original
output's norm (the output at the key, averaged over the fact's contexts). The write then maps
the key to (original output + delta): delta is the value edit_keys.write takes.
"""
from __future__ import annotations

import torch

LR = 0.5  # ROME's v_lr (hparams/ROME/gpt2-xl.json)
STEPS = 20  # v_num_grad_steps
KL_FACTOR = 0.0625  # kl_factor
WEIGHT_DECAY = 0.5  # v_weight_decay
CLAMP = 4.0  # clamp_norm_factor
STOP = 0.05  # the loss under which ROME stops
VALUES = ("auto", "closed", "optimise")  # how the editor finds a write's value (probe/editing.py)
VALUE_HELP = ("each write's value: auto (the closed form where it, doubled, makes the new answer win; ROME's v* "
              "for the facts where it does not) | closed (the margin through the unembedding or the later blocks, to "
              "first order) | optimise (ROME's v*)")


def output_hook(store: str, layer: int) -> str:
    """The hook of a store's output in block `layer` [batch, pos, d_model]."""
    return f"blocks.{layer}.hook_{'mlp' if store == 'mlp' else 'attn'}_out"


def original_output(model, tokens: torch.Tensor, positions: torch.Tensor, store: str, head: int | None,
                    layer: int) -> torch.Tensor:
    """The store's output at positions[i] of prompt i, mean over the prompts [d_model]: the
    MLP's output, or head `head`'s write z W_O[head] (without b_O)."""
    name = f"blocks.{layer}.attn.hook_z" if store == "ov" else output_hook(store, layer)
    with torch.inference_mode():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n == name)
    rows = torch.arange(len(tokens), device=tokens.device)
    if store == "mlp":
        return cache[name][rows, positions].float().mean(0)
    z = cache[name][rows, positions, head].float()  # [n, d_head]
    return (z @ model.W_O[layer, head].detach().float()).mean(0)


def optimised_value(model, tokens: torch.Tensor, positions: torch.Tensor, new: int, essence: torch.Tensor,
                    essence_positions: torch.Tensor, store: str, head: int | None, layer: int) -> torch.Tensor:
    """delta [d_model] (module docstring) for one fact: its prompts `tokens` [n, T] with the
    key at `positions` [n], the new answer's id `new`, the same subject's other prompts
    `essence` [m, T] with the key at `essence_positions` [m]."""
    target = original_output(model, tokens, positions, store, head, layer)  # [d_model]
    scale = target.norm().clamp(min=1e-6)
    prompts = torch.cat([tokens, essence])  # [n + m, T]
    where = torch.cat([positions, essence_positions])
    rows = torch.arange(len(prompts), device=prompts.device)
    delta = torch.zeros_like(target, requires_grad=True)

    def add(x, hook):
        x = x.clone()
        x[rows, where] = x[rows, where] + delta.to(x.dtype)
        return x
    with torch.inference_mode():
        before = torch.log_softmax(model(prompts)[len(tokens):, -1].float(), -1)  # [m, O], none for m = 0
    before = before.clone()
    opt = torch.optim.Adam([delta], lr=LR)
    for step in range(STEPS):
        with torch.enable_grad():
            logits = model.run_with_hooks(prompts, fwd_hooks=[(output_hook(store, layer), add)])[:, -1].float()
            log_p = torch.log_softmax(logits, -1)  # [n + m, O]
            nll = -log_p[:len(tokens), new].mean()
            after = log_p[len(tokens):]
            kl = (after.exp() * (after - before)).sum() / max(len(essence), 1)  # mean over the m prompts
            loss = nll + KL_FACTOR * kl + WEIGHT_DECAY * delta.norm() / scale ** 2
            if loss.item() < STOP or step == STEPS - 1:
                break
            opt.zero_grad()
            delta.grad = torch.autograd.grad(loss, delta)[0]
        opt.step()
        with torch.no_grad():
            most = CLAMP * scale
            if delta.norm() > most:
                delta.mul_(most / delta.norm())
    return delta.detach()


def found_by(optimised) -> list[str]:
    """Each edit's value as results record it (a `value` column, beside any run's but the closed
    form's): `optimised` (ROME's v*) or `closed`."""
    return ["optimised" if o else "closed" for o in optimised]


def recorded_settings(settings: dict) -> dict:
    """An edit's settings as results record them: `value` only where it is not the closed form,
    so that the closed form's results read as before."""
    return {k: v for k, v in settings.items() if not (k == "value" and v == "closed")}
