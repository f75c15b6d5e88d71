"""Hand-built models whose fact storage is known (paper section 4), written as checkpoints.

python -m models.recall.constructions --kind attention|mlp --out DIR

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
embeddings and answer directions (a pseudo-inverse), which is exact once d >= d_vocab + R*D.
`build_storage` generalises both: a plan says, fact by fact, whether attention, the MLP,
both or neither keeps it (the models the storage rule is validated on).
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

from models.checkpoint import write_checkpoint
from models.cli import add_config_flags, given, override, parser, run_cli
from models.cores.forward import last_position_logits
from models.out_folder import FORCE_HELP, prepare_out
from models.recall.config import ModelConfig, TaskConfig
from models.recall.trainer import EVAL_SEED
from models.recall.weights import init_weights, stack
from models.section import ATTN, MLP
from tasks.factual_recall import FactualRecallTask

ATTENTION_LOGIT = 20.0  # score of a head's own group token at the EOS query (others get 0)
ANSWER_LOGIT = 10.0  # logit an answer receives from each token tied to it


def head_groups(task: FactualRecallTask, n_heads: int) -> list[list[int]]:
    """Token ids per head: subjects on the first half of the heads, relations on the rest,
    so a head never sees two of its tokens in one sequence."""
    if n_heads < 2:
        raise ValueError("the constructions need at least 2 heads (subject heads and relation heads).")
    subject_heads = max(1, round(n_heads * task.n_subjects / (task.n_subjects + task.n_relations)))
    subject_heads = min(subject_heads, n_heads - 1)

    def split(ids, k):
        return [ids[i::k] for i in range(k)]

    return split(list(range(task.n_subjects)), subject_heads) + \
        split([task.relation_token(r) for r in range(task.n_relations)], n_heads - subject_heads)


STORES = ("attention", "mlp", "both", "none")  # where a construction keeps one fact


def build(kind: str, task: FactualRecallTask, cfg: ModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Weights of the Theorem 3 (`attention`) or Theorem 4 (`mlp`) construction on the
    standard frozen random embeddings of `seed`."""
    if kind not in ("attention", "mlp"):
        raise ValueError(f"kind must be 'attention' or 'mlp', got {kind!r}.")
    plan = [[kind] * task.n_relations for _ in range(task.n_subjects)]
    return build_storage(task, cfg, plan, relation_logit=ANSWER_LOGIT if kind == "attention" else 0.0, seed=seed)


def build_storage(task: FactualRecallTask, cfg: ModelConfig, plan: list[list[str]],
                  attention_logit: float = ANSWER_LOGIT, mlp_logit: float = ANSWER_LOGIT,
                  relation_logit: float | None = None, seed: int = 0) -> dict[str, torch.Tensor]:
    """A model whose storage is known fact by fact: plan[s][r] in STORES says where fact
    (s, r) is kept. Heads attend to their group's token at the EOS query (Theorem 3).

    - `attention`/`both`: the subject's OV row writes `attention_logit` onto u_a*(s, r).
    - `mlp`/`both`: one MLP unit fires on e_s + e_r only and writes `mlp_logit` onto u_a*.
    - `none`: the subject's OV row writes `attention_logit` onto a wrong answer of A_r, so
      the model does not know the fact.
    - every relation's OV row writes `relation_logit` (default: the larger of the two
      others) onto all of A_r: the answer belongs to the relation, whoever picks it within
      A_r, and beats the subject's answers to other relations.
    - with an MLP, every OV row also copies its token (Theorem 4) along a direction the
      unembedding does not read, so the MLP sees e_s + e_r and attention's logits are its
      answer writes alone.

    Tokens are read through the dual basis of the embeddings and answer directions
    together, so readings are exact and blind to the answer writes (needs d >= V + R*D)."""
    d, H, dh = cfg.d_model, cfg.n_heads, cfg.d_head
    if d < task.d_vocab + task.d_vocab_out:
        raise ValueError(f"the constructions need d_model >= d_vocab + R*D = {task.d_vocab + task.d_vocab_out}, "
                         f"got {d}.")
    groups = head_groups(task, H)
    if max(map(len, groups)) > dh:
        raise ValueError(f"each head holds up to {max(map(len, groups))} tokens, more than d_head = {dh}; "
                         "raise --d-head or --n-heads.")
    unknown = sorted({where for row in plan for where in row} - set(STORES))
    if len(plan) != task.n_subjects or any(len(row) != task.n_relations for row in plan) or unknown:
        raise ValueError(f"plan must be [S={task.n_subjects}][R={task.n_relations}] entries of {STORES}.")
    in_mlp = [(s, r) for s in range(task.n_subjects) for r in range(task.n_relations) if plan[s][r] in ("mlp", "both")]
    if in_mlp and (cfg.attn_only or cfg.d_mlp < len(in_mlp)):
        raise ValueError(f"the plan keeps {len(in_mlp)} facts in the MLP: it needs an MLP with d_mlp >= {len(in_mlp)}.")
    relation_logit = max(attention_logit, mlp_logit) if relation_logit is None else relation_logit
    w = init_weights(cfg, task, seed)
    E, W_U = w["embed.W_E"], w["unembed.W_U"]  # [V, d], [d, O]
    # [d, V]: e_z . reader[:, z'] = 1{z = z'}, u_a . reader = 0
    reader = torch.linalg.pinv(torch.cat([E, W_U.T]))[:, :task.d_vocab]
    writer = torch.linalg.pinv(W_U)  # [O, d]: writer[a] @ W_U = one-hot(a), in the span of the u_a
    copy = E - (E @ writer.T) @ W_U.T  # [V, d]: e_z without its part the unembedding reads
    scale = math.sqrt(ATTENTION_LOGIT * math.sqrt(dh))
    for key in (ATTN + "W_Q", ATTN + "W_K", ATTN + "W_V", ATTN + "W_O"):
        w[key].zero_()
    for h, group in enumerate(groups):
        w[ATTN + "W_Q"][h, :, 0] = scale * reader[:, task.eos]
        w[ATTN + "W_K"][h, :, 0] = scale * reader[:, group].sum(1)
        for slot, z in enumerate(group):
            w[ATTN + "W_V"][h, :, slot] = reader[:, z]  # slot holds 1 when z is attended
            answers = _attention_answers(task, plan, z, attention_logit, relation_logit)  # [O]
            w[ATTN + "W_O"][h, slot] = answers @ writer + (copy[z] if not cfg.attn_only else 0.0)
    if not cfg.attn_only:
        _associative_memory(w, task, in_mlp, reader, writer * mlp_logit)
    return w


def _attention_answers(task: FactualRecallTask, plan: list[list[str]], z: int, attention_logit: float,
                       relation_logit: float) -> torch.Tensor:
    """The logits [O] that token z's OV row writes: a subject's answers of the facts it
    keeps in attention (or its wrong answer when it knows none), a relation's D answers."""
    target = torch.zeros(task.d_vocab_out)
    if z >= task.n_subjects:
        target[list(task.relation_answers(z - task.n_subjects))] = relation_logit
        return target
    for r, where in enumerate(plan[z]):
        answer = int(task.facts[z, r])
        if where in ("attention", "both"):
            target[answer] = attention_logit
        elif where == "none":  # the next answer of A_r: a wrong belief
            block = task.relation_answers(r)
            target[block[(answer - block.start + 1) % len(block)]] = attention_logit
    return target


def _associative_memory(w: dict, task: FactualRecallTask, facts: list[tuple[int, int]], reader: torch.Tensor,
                        writer: torch.Tensor) -> None:
    """MLP unit k = (s, r) of `facts` fires on e_s + e_r only (pre-activation 1 + 1 - 1.5)
    and writes writer[a*] (twice, as it fires at 0.5)."""
    m = w[MLP + "W_in"].shape[1]
    W_in, b_in, W_out = torch.zeros_like(w[MLP + "W_in"]), torch.full((m,), -1e4), torch.zeros_like(w[MLP + "W_out"])
    for k, (s, r) in enumerate(facts):
        W_in[:, k] = reader[:, s] + reader[:, task.n_subjects + r]
        b_in[k] = -1.5
        W_out[k] = 2 * writer[task.facts[s, r]]
    w[MLP + "W_in"], w[MLP + "b_in"], w[MLP + "W_out"] = W_in, b_in, W_out


def accuracy(weights: dict, task: FactualRecallTask, n: int = 8192) -> float:
    """Held-out accuracy of a single model's weights."""
    batch = task.eval_set(n, EVAL_SEED)
    logits = last_position_logits(stack([weights]), batch.tokens[None])[0]
    return (logits.argmax(-1) == batch.answers).float().mean().item()


CONSTRUCTION_TASK = TaskConfig(n_subjects=8, n_relations=4, answers_per_relation=4, n_noise=16, seq_len=12)
CONSTRUCTION_MODEL = ModelConfig(d_model=48, n_heads=4, d_head=4, d_mlp=32)


def main(argv=None) -> int:
    p = parser("python -m models.recall.constructions", __doc__)
    p.add_argument("--kind", required=True, choices=("attention", "mlp"),
                   help="attention: Theorem 3 (facts in the OV circuit); mlp: Theorem 4 (facts in the MLP)")
    p.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument("--seed", type=int, default=0, help="seed of the frozen random embeddings (default 0)")
    add_config_flags(p, TaskConfig, "task", default_label="default", base=CONSTRUCTION_TASK)
    add_config_flags(p, ModelConfig, "model", default_label="default", base=CONSTRUCTION_MODEL, exclude=("n_layers",))
    args = p.parse_args(argv)
    task = override(CONSTRUCTION_TASK, given(args, TaskConfig)).build()
    cfg = override(CONSTRUCTION_MODEL, {"attn_only": args.kind == "attention", **given(args, ModelConfig)})
    weights = build(args.kind, task, cfg, args.seed)
    acc = accuracy(weights, task)
    training = {"construction": "theorem3" if args.kind == "attention" else "theorem4", "storage": args.kind,
                "seed": args.seed, "final_accuracy": acc, "attention_logit": ATTENTION_LOGIT,
                "answer_logit": ANSWER_LOGIT}
    write_checkpoint(prepare_out(args.out, args.force), cfg.checkpoint_section(task), task, training, weights)
    print(f"{args.kind} construction ({training['construction']}): {task}, "
          f"{cfg.checkpoint_section(task).shape}; held-out accuracy {acc:.4f}; "
          f"wrote {args.out}/")
    return 0


if __name__ == "__main__":
    run_cli(main)
