"""python -m analyses.edit_facts CKPT --fact 3:1 --to R1:a2 [--at mlp|ov|auto] [--head H] [--layer L]
   [--position last|subject]
   python -m analyses.edit_facts study CKPT [CKPT ...]   (analyses/edit_study.py)

Edit facts where they live: a rank-one write (ROME) to an MLP's W_out or to one head's
W_O that gives fact SUBJECT:RELATION a new answer (by its name, R1:a2, or its id); several
--fact/--to pairs are written at once (MEMIT's batched write). In a deeper model --layer
chooses the block (default the last; with --position subject, an MLP keyed at the subject's
position as ROME keys, block 0). --at auto (one-layer models) writes each fact
where locate_facts says it lives (both stores where it lives in both, or is spread over
them), an ov write to the head that carries the subject (editing.carrying_head) unless
--head says which. Writes edits.csv (per edit: store, head, efficacy with its interval, the old
answer's rank, the new answer's margin, the leak onto the subject's other facts) and
summary.json (specificity: the share of every other fact's answers unchanged, by group, with
intervals; the weight change's norm) to DIR (default CKPT/analysis/edit_facts/<edits>),
measured on held-out noise contexts. The checkpoint is never changed: --save DIR writes the
edited model as a checkpoint of its own, which every analysis opens (docs/editing.md).
"""
from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from analyses import recorded
from analyses.sweeps import cli
from analyses.sweeps.output import write_csv, write_summary
from analyses.visualize import parse_facts
from models import load
from models.checkpoint import load_checkpoint, write_checkpoint
from models.out_folder import FORCE_HELP, prepare_out
from models.section import one_layer
from probe import columns, edit_keys
from probe.edit_effects import edit_effects
from probe.edit_values import VALUE_HELP, VALUES, found_by, recorded_settings
from probe.editing import POSITIONS, FactEdit, carrying_head, checked_edits, edit_facts, held
from probe.prompts import fact_batch
from tasks.factual_recall import FactualRecallTask

WHERE = {"attention": "ov", "mlp": "mlp", "both": "both", "distributed": "both"}  # storage label -> write


@dataclass(frozen=True)
class EditSettings:
    """How the edit is keyed and measured."""

    contexts: int = field(default=8, metadata={"help": "noise contexts per fact for the keys (and, held out, for "
                                                       "the measurements)"})
    margin: float = field(default=2.0, metadata={"help": "logits by which the new answer should win"})
    form: str = field(default="exact", metadata={"help": "several facts at once: exact (each key mapped to its "
                                                         "value) | memit (MEMIT's (C + K K^T)^-1 form)",
                                                 "choices": ("exact", "memit")})
    value: str = field(default="auto", metadata={"help": VALUE_HELP, "choices": VALUES})

    def __post_init__(self):
        cli.at_least(self, contexts=1)
        cli.require(self, "margin", self.margin > 0, "> 0")


def one_fact(text: str, task: FactualRecallTask) -> tuple[int, int]:
    """--fact 3:1 -> (3, 1), by locate_facts' --facts rule, one fact."""
    try:
        facts = parse_facts(text, task)
    except ValueError as e:
        raise ValueError(str(e).replace("--facts:", "--fact:", 1)) from None
    if len(facts) != 1:
        raise ValueError(f"--fact takes one fact (give --fact/--to once per fact), got {text!r}.")
    return facts[0]


def answer_id(text: str, task: FactualRecallTask, relation: int) -> int:
    """--to R1:a2 (the name the toolkit prints) or 6 (its id) -> the answer id, one of A_r."""
    names = {task.answer_label(a): a for a in range(task.d_vocab_out)}
    answer = names.get(text.strip()) if not text.strip().isdigit() else int(text)
    block = task.relation_answers(relation)
    if answer not in block:
        raise ValueError(f"--to {text}: not one of relation R{relation}'s answers "
                         f"({', '.join(task.answer_label(a) for a in block)}, or ids {block[0]}..{block[-1]}).")
    return answer


def plan(model, task: FactualRecallTask, facts, answers, at: str, head: int | None,
         settings: EditSettings, seed: int, layer: int | None = None, position: str = "last") -> list[FactEdit]:
    """The edits to write: each at `at`, or where locate_facts says its fact lives (auto)."""
    if at != "auto":
        return [FactEdit(s, r, a, at, head, layer, position) for (s, r), a in zip(facts, answers)]
    from analyses.locate_facts import locate  # the storage labels: only auto needs them

    held(model, task, [FactEdit(s, r, a) for (s, r), a in zip(facts, answers)], settings.contexts, seed)
    located = locate(model, task, contexts=max(2, settings.contexts), patch_contexts=1, seed=seed,
                     progress=False, facts=facts).facts.droplevel(columns.ANSWER)
    tokens = fact_batch(task, settings.contexts, seed, next(model.parameters()).device).tokens
    norms = edit_keys.head_key_norms(model, tokens, settings.contexts)  # [F, H] the keys the ov writes read
    edits = []
    for (s, r), a in zip(facts, answers):
        row = located.loc[(s, r)]
        restored = [row[columns.patch("subject", columns.head(h))] for h in range(model.cfg.n_heads)]
        chosen = head if head is not None else carrying_head(restored, norms[s * task.n_relations + r].tolist())
        edits.append(FactEdit(s, r, a, WHERE[row[columns.LABEL]], chosen))
    return edits


def parser():
    p = cli.checkpoint_parser("edit_facts", __doc__, "the noise contexts of the keys")
    p.add_argument("--fact", action="append", required=True, metavar="S:R",
                   help="the fact to edit, as locate_facts --facts names it (3:1); once per edited fact")
    p.add_argument("--to", action="append", required=True, metavar="ANSWER",
                   help="its new answer: a name the toolkit prints (R1:a2) or an answer id; once per --fact")
    p.add_argument("--at", choices=("mlp", "ov", "auto"), default="mlp",
                   help="the store written: the MLP's W_out, a head's W_O, or where the fact lives (default mlp)")
    p.add_argument("--head", type=cli.whole_number("head"), default=None,
                   help="the head an ov write goes to (needed with more than one head, but for --at auto)")
    p.add_argument("--layer", type=cli.whole_number("layer"), default=None,
                   help="the block written (default: the last; block 0 with --position subject)")
    p.add_argument("--position", choices=POSITIONS, default="last",
                   help="where an MLP write's key is read: the last position, or the subject's (ROME's key; the "
                        "block's MLP output there reaches the answer through a later block's heads)")
    p.add_argument("--save", type=Path, default=None, metavar="DIR",
                   help="write the edited model as a checkpoint to DIR (never the checkpoint read)")
    p.add_argument("--force", action="store_true", help=FORCE_HELP.replace("--out", "--save"))
    cli.add_settings(p, EditSettings, "the edit")
    return p


def edits_folder(edits: list[FactEdit], at: str, layer: int | None = None, position: str = "last") -> str:
    """The folder of one set of edits: 3-1_to_6_at-mlp (the first 4, then how many), then
    the layer and the subject position where given (_at-mlp-L0-subject)."""
    names = [f"{e.subject}-{e.relation}_to_{e.answer}" for e in edits]
    shown = "_".join(names[:4]) + (f"_and_{len(names) - 4}_more" if len(names) > 4 else "")
    return f"{shown}_at-{at}" + (f"-L{layer}" if layer is not None else "") + ("-subject" if position != "last" else "")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    if argv[:1] == ["study"]:  # what localization is worth, over many facts and checkpoints
        from analyses import edit_study

        return edit_study.main(argv[1:])
    args = parser().parse_args(argv)
    settings = cli.settings(args, EditSettings)
    if len(args.fact) != len(args.to):
        raise ValueError(f"give one --to per --fact: {len(args.fact)} --fact, {len(args.to)} --to.")
    if args.save is not None and (Path(args.ckpt).resolve() == args.save.resolve()
                                  or Path(args.ckpt).resolve() in args.save.resolve().parents):
        raise ValueError(f"--save {args.save} is the checkpoint read (or inside it): the edited model goes to a "
                         "folder of its own.")
    out = cli.out_dir(args, "CKPT/analysis/edit_facts")  # the --out rule, before anything is loaded
    model, task = load(args.ckpt, args.device, args.step, kind="factual_recall")
    if args.at == "auto":  # locate_facts' labels name a one-layer model's stores
        one_layer(model.cfg.n_layers, args.ckpt, "edit_facts --at auto")
    facts = [one_fact(text, task) for text in args.fact]
    answers = [answer_id(text, task, r) for text, (_, r) in zip(args.to, facts)]
    if args.out is None:
        chosen = [FactEdit(s, r, a) for (s, r), a in zip(facts, answers)]
        out = out / edits_folder(chosen, args.at, args.layer, args.position) / recorded.settings_folder(settings)
    origin = recorded.source(args.ckpt, args.step)
    wanted = {"step": args.step, recorded.HASH: origin[recorded.HASH],
              "settings": {**recorded_settings(asdict(settings)), "seed": args.seed, "at": args.at, "head": args.head,
                           "layer": args.layer, "position": args.position,
                           "edits": [[s, r, a] for (s, r), a in zip(facts, answers)]}}
    recorded.refuse_other_results("edit_facts", out, wanted, args.ckpt, "edit_facts")
    if args.at != "auto":
        checked_edits(model, task, [FactEdit(s, r, a, args.at, args.head, args.layer, args.position)
                                    for (s, r), a in zip(facts, answers)])
    elif args.layer is not None or args.position != "last":
        raise ValueError("--at auto writes where each fact lives: give --layer and --position with --at mlp or ov.")
    start = time.perf_counter()
    edits = plan(model, task, facts, answers, args.at, args.head, settings, args.seed, args.layer, args.position)
    edited = edit_facts(model, task, edits, settings.contexts, args.seed, settings.margin, settings.form,
                        value=settings.value)
    table, specificity = edit_effects(model, edited.model, task,
                                      [(e.subject, e.relation, old, e.answer)
                                       for e, old in zip(edited.edits, edited.old_answers)],
                                      settings.contexts, args.seed)
    table.insert(2, "at", [e.at for e in edited.edits])
    table.insert(3, "head", [e.head if e.at != "mlp" else None for e in edited.edits])
    table.insert(4, "layer", [e.layer for e in edited.edits])
    table.insert(5, "position", [e.position for e in edited.edits])
    table["old_name"] = [task.answer_label(a) for a in table["old_answer"]]
    table["new_name"] = [task.answer_label(a) for a in table["new_answer"]]
    table["boost"] = edited.boosts
    if settings.value != "closed":
        table["value"] = found_by(edited.optimised)
    norms = {}
    for key, delta in edited.deltas.items():  # blocks.L.mlp.W_out, blocks.L.attn.W_O
        layer, weight = int(key.split(".")[1]), key.split(".")[-1]
        base = (model.W_out if weight == "W_out" else model.W_O)[layer].detach()
        name = weight if model.cfg.n_layers == 1 else f"{weight} L{layer}"
        norms[name] = {"norm": float(delta.norm()), "relative": float(delta.norm() / base.norm().clamp(min=1e-12))}
    summary = {**wanted, **origin, "specificity": specificity, "weight_change": norms,
               "efficacy": float(table["efficacy"].mean()), "seconds": round(time.perf_counter() - start, 2)}
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "edits.csv", table)
    write_summary(out / "summary.json", summary)
    if args.save is not None:
        save(args, edited.deltas, summary)
    print(report(table, specificity, norms, args.ckpt, out, args.save))
    return 0


def save(args, deltas: dict, summary: dict) -> None:
    """The edited model as a checkpoint in --save: the read weights plus each write."""
    checkpoint = load_checkpoint(args.ckpt, args.step, "factual_recall")
    weights = {k: v + deltas[k].to(v) if k in deltas else v for k, v in checkpoint.weights.items()}
    training = {**checkpoint.config["training"],
                "edited": {k: summary[k] for k in ("checkpoint", "step", recorded.HASH, "settings")}}
    write_checkpoint(prepare_out(args.save, args.force), checkpoint.section, checkpoint.task, training, weights)


def report(table, specificity: dict, norms: dict, ckpt: str, out: Path, saved: Path | None) -> str:
    lines = [f"{ckpt}: {len(table)} edit{'s' * (len(table) != 1)}"]
    for row in table.itertuples():
        where = (row.at + (f" (head {int(row.head)})" if row.at != "mlp" else "") + f", layer {row.layer}"
                 + (" at the subject" if row.position == "subject" else ""))
        lines.append(f"  S{row.subject} R{row.relation}: {row.old_name} -> {row.new_name} at {where}: efficacy "
                     f"{row.efficacy:.2f} [{row.efficacy_low:.2f}, {row.efficacy_high:.2f}], old answer's rank "
                     f"{row.old_rank:.1f}, margin {row.new_margin:+.2f}, leak {row.leak:.2f}")
    for group, s in specificity.items():
        if s["facts"]:
            lines.append(f"  other facts unchanged, {group.replace('_', ' ')}: {s['share']:.3f} "
                         f"[{s['low']:.3f}, {s['high']:.3f}] of {s['facts']}")
    lines += [f"  weight change {name}: {v['norm']:.3g} ({100 * v['relative']:.1f}% of its norm)"
              for name, v in norms.items()]
    lines.append(f"wrote {out}/ (edits.csv, summary.json)" + (f" and the edited model to {saved}/" if saved else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    cli.run_cli(main)
