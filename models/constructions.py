"""Hand-built models whose fact storage is known (paper section 4), written as checkpoints.

python -m models.constructions --kind attention|mlp --out DIR

- attention (Theorem 3): subjects and relations are split into groups, one per head; at
  the EOS query head h attends to the one token of its group in the sequence, and its OV
  circuit maps that token to the superposition of its answers (a subject to its R
  answers, a relation to its D answers). a*(s, r) gets a logit from both heads, every
  other answer of A_r from at most one. No MLP: all facts live in attention.
- mlp (Theorem 4): the same heads only copy (aggregate OV = identity on subject and
  relation embeddings), so the attention output at EOS is e_s + e_r; the MLP is the
  associative memory e_s + e_r -> u_a*, one hidden unit per fact. All facts live in the MLP.

Where the paper reads tokens through random projections (whose cross-talk needs d of
order 1000 for 100% accuracy), we read them through the dual basis of the frozen random
embeddings (the pseudo-inverse), which is exact once d >= d_vocab and d >= R*D.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from models.cli import add_config_flags, given, prepare_out, run_cli
from models.config import ModelConfig, TaskConfig, override
from models.forward import last_position_logits
from models.trainer import EVAL_SEED, TrainResult
from models.weights import ATTN, MLP, init_weights, stack
from probe.task import FactualRecallTask

ATTENTION_LOGIT = 20.0  # score of a head's own group token at the EOS query (others get 0)
ANSWER_LOGIT = 10.0  # logit an answer receives from each token tied to it


def head_groups(task: FactualRecallTask, n_heads: int) -> list[list[int]]:
    """Token ids per head: subjects on the first half of the heads, relations on the rest,
    so a head never sees two of its tokens in one sequence."""
    if n_heads < 2:
        raise ValueError("the constructions need at least 2 heads (subject heads and relation heads).")
    subject_heads = max(1, round(n_heads * task.n_subjects / (task.n_subjects + task.n_relations)))
    subject_heads = min(subject_heads, n_heads - 1)
    split = lambda ids, k: [ids[i::k] for i in range(k)]
    return split(list(range(task.n_subjects)), subject_heads) + \
        split([task.relation_token(r) for r in range(task.n_relations)], n_heads - subject_heads)


def build(kind: str, task: FactualRecallTask, model: ModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Weights of the Theorem 3 (`attention`) or Theorem 4 (`mlp`) construction on the
    standard frozen random embeddings of `seed`."""
    if kind not in ("attention", "mlp"):
        raise ValueError(f"kind must be 'attention' or 'mlp', got {kind!r}.")
    d, H, dh = model.d_model, model.n_heads, model.d_head
    if d < task.d_vocab or d < task.d_vocab_out:
        raise ValueError(f"the constructions need d_model >= d_vocab = {task.d_vocab} and >= R*D = "
                         f"{task.d_vocab_out}, got {d}.")
    groups = head_groups(task, H)
    if max(map(len, groups)) > dh:
        raise ValueError(f"each head holds up to {max(map(len, groups))} tokens, more than d_head = {dh}; "
                         "raise --d-head or --n-heads.")
    if kind == "mlp" and (model.attn_only or model.d_mlp < task.n_facts):
        raise ValueError(f"the mlp construction needs an MLP with d_mlp >= S*R = {task.n_facts}.")
    w = init_weights(model, task, seed)
    E, W_U = w["embed.W_E"], w["unembed.W_U"]  # [V, d], [d, O]
    reader = torch.linalg.pinv(E)  # [d, V]: e_z . reader[:, z'] = 1{z = z'}
    writer = torch.linalg.pinv(W_U)  # [O, d]: writer[a] @ W_U = one-hot(a)
    scale = math.sqrt(ATTENTION_LOGIT * math.sqrt(dh))
    for key in (ATTN + "W_Q", ATTN + "W_K", ATTN + "W_V", ATTN + "W_O"):
        w[key].zero_()
    for h, group in enumerate(groups):
        w[ATTN + "W_Q"][h, :, 0] = scale * reader[:, task.eos]
        w[ATTN + "W_K"][h, :, 0] = scale * reader[:, group].sum(1)
        for slot, z in enumerate(group):
            w[ATTN + "W_V"][h, :, slot] = reader[:, z]  # slot holds 1 when z is attended
            w[ATTN + "W_O"][h, slot] = _answers_of(task, z) @ writer * ANSWER_LOGIT if kind == "attention" else E[z]
    if kind == "mlp":
        _associative_memory(w, task, reader, writer)
    return w


def _answers_of(task: FactualRecallTask, z: int) -> torch.Tensor:
    """Indicator [O] of the answers tied to token z: a subject's R answers, a relation's D."""
    target = torch.zeros(task.d_vocab_out)
    if z < task.n_subjects:
        target[task.facts[z]] = 1.0
    else:
        target[list(task.relation_answers(z - task.n_subjects))] = 1.0
    return target


def _associative_memory(w: dict, task: FactualRecallTask, reader: torch.Tensor, writer: torch.Tensor) -> None:
    """MLP unit f = (s, r) fires on e_s + e_r only (pre-activation 1 + 1 - 1.5), and writes u_a*."""
    subjects, relations, answers = task.all_facts()
    m = w[MLP + "W_in"].shape[1]
    W_in, b_in, W_out = torch.zeros_like(w[MLP + "W_in"]), torch.full((m,), -1e4), torch.zeros_like(w[MLP + "W_out"])
    F = task.n_facts
    W_in[:, :F] = reader[:, subjects] + reader[:, task.n_subjects + relations]
    b_in[:F] = -1.5
    W_out[:F] = 2 * ANSWER_LOGIT * writer[answers]
    w[MLP + "W_in"], w[MLP + "b_in"], w[MLP + "W_out"] = W_in, b_in, W_out


def accuracy(weights: dict, task: FactualRecallTask, n: int = 8192) -> float:
    """Held-out accuracy of a single model's weights."""
    batch = task.eval_set(n, EVAL_SEED)
    logits = last_position_logits(stack([weights]), batch.tokens[None])[0]
    return (logits.argmax(-1) == batch.answers).float().mean().item()


CONSTRUCTION_TASK = TaskConfig(n_subjects=8, n_relations=4, answers_per_relation=4, n_noise=16, seq_len=12)
CONSTRUCTION_MODEL = ModelConfig(d_model=48, n_heads=4, d_head=4, d_mlp=32)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m models.constructions", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kind", required=True, choices=("attention", "mlp"),
                   help="attention: Theorem 3 (facts in the OV circuit); mlp: Theorem 4 (facts in the MLP)")
    p.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")
    p.add_argument("--force", action="store_true", help="replace an existing checkpoint at --out")
    p.add_argument("--seed", type=int, default=0, help="seed of the frozen random embeddings (default 0)")
    add_config_flags(p, TaskConfig, "task")
    add_config_flags(p, ModelConfig, "model")
    args = p.parse_args(argv)
    task = override(CONSTRUCTION_TASK, given(args, TaskConfig)).build()
    model = override(CONSTRUCTION_MODEL, {"attn_only": args.kind == "attention", **given(args, ModelConfig)})
    weights = build(args.kind, task, model, args.seed)
    acc = accuracy(weights, task)
    training = {"construction": "theorem3" if args.kind == "attention" else "theorem4", "storage": args.kind,
                "seed": args.seed, "final_accuracy": acc, "attention_logit": ATTENTION_LOGIT,
                "answer_logit": ANSWER_LOGIT}
    result = TrainResult(task, model.checkpoint_section(task), weights, training, [], {}, {})
    result.save(prepare_out(args.out, args.force))
    print(f"{args.kind} construction ({training['construction']}): {task}, d={model.d_model} H={model.n_heads} "
          f"d_h={model.d_head} m={None if model.attn_only else model.d_mlp}; held-out accuracy {acc:.4f}; wrote {args.out}/")
    return 0


if __name__ == "__main__":
    run_cli(main)
