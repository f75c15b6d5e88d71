"""Hand-built L-layer models (L >= 2) whose storage is known fact by fact, in layer and component.

python -m models.recall.deep_constructions --kind last-mlp|enriched|mixed [--n-layers L] --out DIR

A plan says, for every fact (s, r), where it is kept (DEPTH_STORES):

- `attention`: in block 0's attention OV circuit. At the EOS query, head h of block 0 attends to
  the one token of its group (models.recall.constructions.head_groups) and its OV row writes the
  subject's answers onto u_a*; the relation's row writes all of A_r (Theorem 3).
- `mlp` (construction (a)): in the last block's MLP, read from the subject and the relation that
  block 0's heads gathered at EOS: each head's OV row also writes its token's own fresh copy
  direction, and one last-block unit per fact fires on copy(s) + copy(r) and writes u_a*.
- `enriched` (construction (b), "subject enrichment, then extraction"): in block 0's MLP at the
  subject's position: one unit per subject fires on its embedding there and writes the subject's
  enriched answers as a code in a subspace of their own; every head of block 1 attends from EOS
  to the subject's position and its OV maps that code to the answers' logits. Block 0's MLP at
  EOS never fires (the subject is there as its copy only), so the fact reaches EOS only through
  block 1's heads.
- `none`: the subject's OV row writes a wrong answer of A_r (the model does not know the fact).

Construction (c) is any plan mixing them. The directions are exact: the tokens are read through
the dual basis of the embeddings and answer directions, and the copies and the enrichment code
lie in fresh orthonormal directions orthogonal to both, so no store reads another's writes.
The stored fact's answer gets its store's logit plus its relation's, every other answer at most
one of the two: accuracy 1.0. Needs d >= d_vocab + 2 R D + S + R.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

from models.checkpoint import write_checkpoint
from models.cli import add_config_flags, given, override, parser, run_cli
from models.out_folder import FORCE_HELP, prepare_out
from models.recall.config import ModelConfig, TaskConfig
from models.recall.constructions import (
    ANSWER_LOGIT,
    ATTENTION_LOGIT,
    CONSTRUCTION_TASK,
    _attention_answers,
    accuracy,
    head_groups,
)
from models.recall.weights import init_weights
from models.section import attn, mlp
from tasks.factual_recall import FactualRecallTask

DEPTH_STORES = ("attention", "mlp", "enriched", "none")
OFF = -1e4  # the input bias of a unit that never fires


def where_stored(store: str, n_layers: int) -> dict:
    """Where a plan entry keeps its fact: the layer, the component and the route by which the answer
    reaches the last position ('direct': written there; 'moved by layer 1 heads')."""
    return {"attention": {"layer": 0, "component": "attention", "route": "direct"},
            "mlp": {"layer": n_layers - 1, "component": "mlp", "route": "direct"},
            "enriched": {"layer": 0, "component": "mlp", "route": "moved by layer 1 heads"},
            "none": {"layer": None, "component": "none", "route": None}}[store]


def fresh_directions(w: dict, n: int) -> torch.Tensor:
    """n orthonormal directions [d, n] orthogonal to every embedding and every answer direction."""
    known = torch.cat([w["embed.W_E"], w["unembed.W_U"].T]).double()  # [V + O, d]
    _, _, vh = torch.linalg.svd(known, full_matrices=True)  # rows past the rank span the complement
    rank = int(torch.linalg.matrix_rank(known))
    if vh.shape[0] - rank < n:
        raise ValueError(f"the depth constructions need d_model >= d_vocab + d_vocab_out + {n} = {rank + n}, "
                         f"got {known.shape[1]}.")
    return vh[rank:rank + n].T.float().contiguous()


def build_depth(task: FactualRecallTask, cfg: ModelConfig, plan: list[list[str]],
                logit: float = ANSWER_LOGIT, seed: int = 0) -> dict[str, torch.Tensor]:
    """Weights of an L-layer model (cfg.n_layers >= 2, with an MLP) keeping fact (s, r) where
    plan[s][r] (one of DEPTH_STORES) says; every store writes `logit`, every relation `logit` onto A_r."""
    L, H, dh = cfg.n_layers, cfg.n_heads, cfg.d_head
    S, R, O = task.n_subjects, task.n_relations, task.d_vocab_out
    unknown = sorted({where for row in plan for where in row} - set(DEPTH_STORES))
    if len(plan) != S or any(len(row) != R for row in plan) or unknown:
        raise ValueError(f"plan must be [S={S}][R={R}] entries of {DEPTH_STORES}.")
    if L < 2 or cfg.attn_only:
        raise ValueError("the depth constructions need n_layers >= 2 and an MLP.")
    groups = head_groups(task, H)
    if max(map(len, groups)) > dh or H * dh < O:
        raise ValueError(f"the depth constructions need d_head >= {max(map(len, groups))} (a head's tokens) and "
                         f"n_heads * d_head >= d_vocab_out = {O}; raise --d-head or --n-heads.")
    in_last = [(s, r) for s in range(S) for r in range(R) if plan[s][r] == "mlp"]
    enriched = [s for s in range(S) if "enriched" in plan[s]]
    if cfg.d_mlp < max(len(in_last), len(enriched)):
        raise ValueError(f"the plan needs d_mlp >= {max(len(in_last), len(enriched))} (a unit per fact kept in the "
                         "last MLP, per subject enriched).")
    w = init_weights(cfg, task, seed)
    E, W_U = w["embed.W_E"], w["unembed.W_U"]  # [V, d], [d, O]
    reader = torch.linalg.pinv(torch.cat([E, W_U.T]))[:, :task.d_vocab]  # [d, V]: e_z . reader[:, z'] = 1{z = z'}
    writer = torch.linalg.pinv(W_U)  # [O, d]: writer[a] @ W_U = one-hot(a)
    fresh = fresh_directions(w, S + R + O)
    copy, code = fresh[:, :S + R], fresh[:, S + R:]  # [d, S + R] token copies, [d, O] the enrichment code
    for key in w:
        if key.startswith("blocks."):
            w[key].zero_()
    for layer in range(L):
        w[mlp(layer) + "b_in"].fill_(OFF)
    scale = math.sqrt(ATTENTION_LOGIT * math.sqrt(dh))
    heads_plan = [["none" if x == "none" else "attention" if x == "attention" else "elsewhere" for x in row]
                  for row in plan]
    A0 = attn(0)
    for h, group in enumerate(groups):  # block 0: Theorem 3's heads, each also copying its token
        w[A0 + "W_Q"][h, :, 0] = scale * reader[:, task.eos]
        w[A0 + "W_K"][h, :, 0] = scale * reader[:, group].sum(1)
        for slot, z in enumerate(group):
            w[A0 + "W_V"][h, :, slot] = reader[:, z]
            answers = _attention_answers(task, heads_plan, z, logit, logit)  # [O]
            w[A0 + "W_O"][h, slot] = answers @ writer + copy[:, z]  # relation r is token S + r
    last = mlp(L - 1)
    for k, (s, r) in enumerate(in_last):  # (a): the last block's unit (s, r) fires on copy(s) + copy(r)
        w[last + "W_in"][:, k] = copy[:, s] + copy[:, S + r]
        w[last + "b_in"][k] = -1.5
        w[last + "W_out"][k] = 2 * logit * writer[task.facts[s, r]]
    for k, s in enumerate(enriched):  # (b): block 0's unit s fires on e_s at the subject's position only
        w[mlp(0) + "W_in"][:, k] = reader[:, s]
        w[mlp(0) + "b_in"][k] = -0.5
        answers = [int(task.facts[s, r]) for r in range(R) if plan[s][r] == "enriched"]
        w[mlp(0) + "W_out"][k] = 2 * logit * code[:, answers].sum(1)
    A1 = attn(1)
    subjects = reader[:, :S].sum(1)
    for h in range(H):  # block 1: every head attends from EOS to the subject and decodes its slice of the code
        w[A1 + "W_Q"][h, :, 0] = scale * reader[:, task.eos]
        w[A1 + "W_K"][h, :, 0] = scale * subjects
        for slot, a in enumerate(range(h * dh, min((h + 1) * dh, O))):
            w[A1 + "W_V"][h, :, slot] = code[:, a]
            w[A1 + "W_O"][h, slot] = writer[a]
    return w


def storage_of(plan: list[list[str]], n_layers: int) -> list[dict]:
    """Every fact's known store: s, r, store (the plan's entry) and where_stored's layer, component, route."""
    return [{"s": s, "r": r, "store": store, **where_stored(store, n_layers)}
            for s, row in enumerate(plan) for r, store in enumerate(row)]


# d >= d_vocab + 2 R D + S + R = 29 + 32 + 12 on the constructions' task; n_heads * d_head >= R D = 16
DEPTH_MODEL = ModelConfig(d_model=80, n_heads=4, d_head=4, d_mlp=32, n_layers=2)
KINDS = {"last-mlp": "mlp", "enriched": "enriched", "mixed": None}  # the plan's one store, or a mix


def plan_for(kind: str, task: FactualRecallTask) -> list[list[str]]:
    """(a) `last-mlp`: every fact in the last MLP; (b) `enriched`: every fact in block 0's MLP at the
    subject, moved by block 1's heads; (c) `mixed`: attention OV, last MLP, enriched in turn ((s + 2 r) mod 3)."""
    mix = ("attention", "mlp", "enriched")
    return [[KINDS[kind] or mix[(s + 2 * r) % 3] for r in range(task.n_relations)] for s in range(task.n_subjects)]


def main(argv=None) -> int:
    p = parser("python -m models.recall.deep_constructions", __doc__)
    p.add_argument("--kind", required=True, choices=tuple(KINDS),
                   help="last-mlp: (a) facts in the last MLP; enriched: (b) in block 0's MLP at the subject, moved by "
                        "block 1's heads; mixed: (c) attention OV, last MLP and enriched, fact by fact")
    p.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument("--seed", type=int, default=0, help="seed of the frozen random embeddings (default 0)")
    add_config_flags(p, TaskConfig, "task", default_label="default", base=CONSTRUCTION_TASK)
    add_config_flags(p, ModelConfig, "model", default_label="default", base=DEPTH_MODEL)
    args = p.parse_args(argv)
    task = override(CONSTRUCTION_TASK, given(args, TaskConfig)).build()
    cfg = override(DEPTH_MODEL, given(args, ModelConfig))
    cfg.validate()
    plan = plan_for(args.kind, task)
    weights = build_depth(task, cfg, plan, seed=args.seed)
    acc = accuracy(weights, task)
    section = cfg.checkpoint_section(task)
    training = {"construction": f"depth-{args.kind}", "storage": args.kind, "seed": args.seed, "final_accuracy": acc,
                "answer_logit": ANSWER_LOGIT, "stores": storage_of(plan, cfg.n_layers)}
    write_checkpoint(prepare_out(args.out, args.force), section, task, training, weights)
    print(f"{args.kind} construction: {task}, {section.shape}; held-out accuracy {acc:.4f}; wrote {args.out}/")
    return 0


if __name__ == "__main__":
    run_cli(main)
