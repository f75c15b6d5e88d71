"""python -m analyses.locate_facts CKPT/ : where does the model keep each fact?

For every fact (s, r) it measures, through the model's hooks: accuracy over many
contexts, direct logit attribution of each head / the MLP / the direct path, zero- and
mean-ablations, ROME-style activation patching of the subject and of the relation,
associative-memory recall probes on the OV circuit and on the MLP, and per head the
attention-denoising scores. A decision rule (probe/storage.py) labels each fact
attention, mlp, both, distributed or not_stored. Writes facts.csv, heads.csv,
head_tokens.csv, summary.json and figures to DIR (default CKPT/analysis/locate_facts; with
settings other than the defaults, a folder inside it named after them, e.g. contexts-4_seed-1,
so they never take the default results' place). summary.json records the checkpoint, the
step and the content hash of the weights measured (weights_sha256). A DIR that holds other
results (other settings or weights, a sweep) is refused, as is a checkpoint's own folder or a
folder inside another checkpoint.

With --facts 3:1,7:0 it measures those facts only, each on the very prompts and against
the same model-wide references (ablation means, chance levels) as in a run over every
fact, so their rows are the same (to float rounding), and prints where each lives, its margin and its heads.

On a model of L = 2 to 4 layers it splits the logits at the last position into paths, each a layer's
attention OV circuit or MLP and the later layers' heads that moved its write there (probe/paths.py),
asks the rule's two conditions of each, and writes per fact its layer, component, route and stores.
"""
from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import pandas as pd

from analyses import plots, recorded
from analyses.locate_summary import LocateSummary
from analyses.sweeps import cli
from analyses.sweeps.output import write_csv, write_summary
from analyses.visualize import parse_facts
from models import load
from models.text import count, number
from models.training.progress import progress_bar
from probe import columns
from probe.ablation import ablations, n_ablation_runs
from probe.accuracy import per_fact_accuracy
from probe.attribution import direct_logit_attribution
from probe.denoising import denoising_scores, head_token_table, specialisation
from probe.hooks import model_device
from probe.memory import recall_probes
from probe.patching import activation_patching
from probe.paths import head_table, n_path_runs, path_measurements
from probe.prompts import FactPrompts, checked_facts
from probe.storage import LABELS, StorageRule, stores_of
from tasks.factual_recall import FactualRecallTask


@dataclass(frozen=True)
class LocateSettings:
    """How many prompts locate_facts measures each fact on, and their seed."""

    contexts: int = field(default=8, metadata={"help": "prompts per fact for accuracy, attribution, ablations"})
    patch_contexts: int = field(default=2, metadata={"help": "prompts per fact for activation patching"})
    seed: int = field(default=0, metadata={"help": "seed of the prompts and bootstrap intervals"})

    def __post_init__(self):
        cli.at_least(self, contexts=2, patch_contexts=1)


@dataclass(frozen=True)
class Located:
    facts: pd.DataFrame  # one row per fact, indexed by (subject, relation, answer): measurements, label
    heads: pd.DataFrame  # one row per head: denoising scores, specialisation, per-head effects
    head_tokens: pd.DataFrame | None  # [head x token] attention mass on each subject / relation (None at depth)
    summary: LocateSummary


def locate(model, task: FactualRecallTask, contexts: int = 8, patch_contexts: int = 2, seed: int = 0,
           rule: StorageRule = StorageRule(), progress: bool = True,
           facts: Sequence[tuple[int, int]] | None = None) -> Located:
    """Every locate_facts measurement on a TransformerBridge `model` and its task: of every
    fact, or of `facts` only ((subject, relation) pairs), each measured on the prompts it
    gets among all of them against the model-wide references of all of them, so its row
    is its row in the run over every fact (to float rounding), at a fraction of the cost."""
    settings = LocateSettings(contexts, patch_contexts, seed)
    start = time.perf_counter()
    chosen = None if facts is None else checked_facts(task, facts)
    # per call: the weights may have changed since the last
    prompts = FactPrompts.build(model, task, contexts, seed, chosen)
    if model.cfg.n_layers > 1:  # no patching at depth: its prompts are not built
        return _locate_deep(model, task, prompts, settings, rule, chosen, start, progress)
    patch_prompts = (prompts if patch_contexts == contexts else
                     FactPrompts.build(model, task, patch_contexts, seed, chosen, references=False))
    bar = progress_bar(total=6 + n_ablation_runs(model), desc="locating facts", unit="run", disable=not progress)

    def step(frame):
        bar.update(1)
        return frame

    parts = [step(per_fact_accuracy(model, task, prompts=prompts)),
             step(direct_logit_attribution(model, task, prompts=prompts)),
             ablations(model, task, progress=lambda: bar.update(1), prompts=prompts),
             step(activation_patching(model, task, "subject", prompts=patch_prompts)),
             step(activation_patching(model, task, "relation", prompts=patch_prompts)),
             step(recall_probes(model, task, prompts=prompts))]
    facts = pd.concat(parts, axis=1)
    facts[columns.LABEL] = rule.label(facts)
    answers = facts.index.get_level_values(columns.ANSWER)
    facts.insert(0, columns.ANSWER_NAME, [task.answer_label(int(a)) for a in answers])
    head_tokens = head_token_table(model, task, prompts=prompts)
    if chosen is not None:  # the tokens of the facts measured: the others are in none of their prompts
        head_tokens = head_tokens[list(dict.fromkeys([task.token_label(s) for s, _ in chosen]
                                                     + [task.token_label(task.relation_token(r)) for _, r in chosen]))]
    heads = step(denoising_scores(model, task, prompts=prompts)).merge(specialisation(head_tokens), on="head")
    heads = heads.merge(_per_head_effects(facts, model.cfg.n_heads), on="head")
    bar.close()
    measured = {**measured_settings(settings, rule, chosen), "device": str(model_device(model))}
    summary = LocateSummary.of(facts, heads, task, measured, round(time.perf_counter() - start, 2))
    return Located(facts, heads, head_tokens, summary)


def _locate_deep(model, task: FactualRecallTask, prompts: FactPrompts, settings: LocateSettings,
                 rule: StorageRule, chosen, start: float, progress: bool) -> Located:
    """locate at depth: the accuracy, and every store's paths to the logits (probe.paths) judged by
    the rule's two conditions, store by store; per (layer, head) the EOS query's attention. Its bar
    counts the path runs and then the stores' measurements as one."""
    bar = progress_bar(total=n_path_runs(prompts) + 1, desc="locating facts", unit="run", disable=not progress)
    paths, stores, writes = path_measurements(model, task, prompts, progress=lambda: bar.update(1))
    facts = pd.concat([per_fact_accuracy(model, task, prompts=prompts), paths], axis=1)
    facts = pd.concat([facts, stores_of(rule, facts, stores)], axis=1)
    answers = facts.index.get_level_values(columns.ANSWER)
    facts.insert(0, columns.ANSWER_NAME, [task.answer_label(int(a)) for a in answers])
    heads = head_table(writes, model.cfg.n_layers, task.seq_len)
    bar.update(1)
    bar.close()
    measured = {**measured_settings(settings, rule, chosen), "device": str(model_device(model))}
    summary = LocateSummary.of(facts, heads, task, measured, round(time.perf_counter() - start, 2), stores)
    return Located(facts, heads, None, summary)


def measured_settings(settings: LocateSettings, rule: StorageRule = StorageRule(),
                      facts: Sequence[tuple[int, int]] | None = None) -> dict:
    """The settings summary.json records (but the device): the prompts', the rule's, and the
    facts measured when not every fact was."""
    return {**asdict(settings), "rule": asdict(rule), **({} if facts is None else {"facts": [list(f) for f in facts]})}


def _per_head_effects(facts: pd.DataFrame, n_heads: int) -> pd.DataFrame:
    """Per head, averaged over facts: its margin, zero/mean-ablation accuracy, OV recall,
    and the share of the logit difference it restores under subject/relation patching."""
    rows = []
    for h in range(n_heads):
        head = columns.head(h)
        rows.append({"head": h, "mean_margin": facts[columns.head_margin(h)].mean(),
                     "zero_ablation_accuracy": facts[columns.ablated_accuracy("zero", head)].mean(),
                     "mean_ablation_accuracy": facts[columns.ablated_accuracy("mean", head)].mean(),
                     "ov_recall": facts[columns.ov_probe(h)].mean(),
                     "patch_subject_restored": facts[columns.patch("subject", head)].mean(),
                     "patch_relation_restored": facts[columns.patch("relation", head)].mean()})
    return pd.DataFrame(rows)


def report(located: Located, ckpt: str, out: Path) -> str:
    """The short human summary printed by the CLI (`fact_report` when some facts were chosen)."""
    s = located.summary
    if s.stores is not None:
        return deep_report(located, ckpt, out)
    if "facts" in s.settings:
        return fact_report(located, ckpt, out)
    lines = _label_lines(s, ckpt)
    lines.append("top heads by denoising score (1 = all attention on the token, 0 = uniform):")
    heads = located.heads.set_index("head")
    for h in s.top_heads[:4]:
        row = heads.loc[h.head]
        picks = _abbreviate(f"{row.subjects} {row.relations}".split())
        lines.append(f"  head {h.head}: subject {h.subject_score:.2f}, relation {h.relation_score:.2f}; "
                     f"attends to {picks}")
    lines.append(f"wrote {out}/ (facts.csv, heads.csv, head_tokens.csv, summary.json, figures) in {s.seconds:.1f} s")
    return "\n".join(lines)


def fact_report(located: Located, ckpt: str, out: Path) -> str:
    """Per chosen fact: where it lives, its margin and each store's part of it, and per head
    its part of the margin, its EOS attention on the fact's subject and relation and the
    share of the logit difference it restores when the subject (relation) is swapped."""
    lines = [f"{ckpt}: {count(len(located.facts), 'chosen fact')}"]
    tokens = located.head_tokens
    for (s, r, _), fact in located.facts.iterrows():
        margins = ", ".join(f"{store} {number(fact[columns.margin(store)], '.2f')}"
                            for store in (*columns.STORES, "direct"))
        margin, low, high = (number(fact[c], ".2f") for c in columns.interval(columns.MARGIN))
        lines.append(f"fact S{s} R{r} -> {fact[columns.ANSWER_NAME]}: {fact[columns.LABEL]}; accuracy "
                     f"{fact[columns.ACCURACY]:.3f}, margin {margin} logits [95% CI {low}, {high}] ({margins})")
        for h in tokens.index:
            head = columns.head(h)
            lines.append(f"  head {h}: margin {number(fact[columns.head_margin(h)], '+.2f')}, attention on S{s} "
                         f"{number(tokens.loc[h, f'S{s}'], '.2f')}, on R{r} {number(tokens.loc[h, f'R{r}'], '.2f')}; "
                         "patching restores "
                         f"{number(fact[columns.patch('subject', head)], '.2f')} (subject), "
                         f"{number(fact[columns.patch('relation', head)], '.2f')} (relation)")
    lines.append(f"wrote {out}/ (facts.csv, heads.csv, head_tokens.csv, summary.json, figures) "
                 f"in {located.summary.seconds:.1f} s")
    return "\n".join(lines)



def _label_lines(s: LocateSummary, ckpt: str) -> list[str]:
    """The report's first lines: the accuracy and each label's count and share with its interval."""
    acc = s.accuracy_interval
    lines = [f"{ckpt}: {s.n_facts} facts, accuracy {acc.value:.3f} [95% CI {acc.low:.3f}, {acc.high:.3f}]",
             "where the facts live:"]
    for label in LABELS:
        ci = s.label_share_intervals[label]
        lines.append(f"  {label:<12}{s.label_counts[label]:>6}  {100 * s.label_shares[label]:5.1f}%"
                     f"  [{100 * ci.low:.1f}, {100 * ci.high:.1f}]")
    return lines

def deep_report(located: Located, ckpt: str, out: Path) -> str:
    """At depth: the accuracy, the labels, the share of facts per (layer, component) and per store
    (with its route), and the chosen facts' stores when some were chosen."""
    s = located.summary
    lines = _label_lines(s, ckpt)
    lines.append("by layer and component (layers from 0; a fact kept in several stores counts in each):")
    width = max((len(place) + 2 for place in s.layer_components), default=0)  # as wide as the longest place
    for place, ci in s.layer_components.items():
        lines.append(f"  {place:<{width}}{round(ci.value * s.n_facts):>6}  {100 * ci.value:5.1f}%"
                     f"  [{100 * ci.low:.1f}, {100 * ci.high:.1f}]")
    lines.append("by store and route:")
    width = max([28, *(len(name) + 2 for name in s.stores)])
    for name, store in s.stores.items():
        if store["facts"]:
            lines.append(f"  {name:<{width}}{store['facts']:>6}  {store['route']}")
    if "facts" in s.settings:
        for (subject, relation, _), fact in located.facts.iterrows():
            kept = fact[columns.STORE_LIST] or "no store"
            lines.append(f"fact S{subject} R{relation} -> {fact[columns.ANSWER_NAME]}: {fact[columns.LABEL]} "
                         f"({kept}); accuracy {fact[columns.ACCURACY]:.3f}")
    lines.append(f"wrote {out}/ (facts.csv, heads.csv, summary.json, figures) in {s.seconds:.1f} s")
    return "\n".join(lines)


def _abbreviate(tokens: list[str], keep: int = 6) -> str:
    if not tokens:
        return "no single token (>= 0.5 of its attention)"
    return " ".join(tokens[:keep]) + (f" ... (+{len(tokens) - keep})" if len(tokens) > keep else "")


def write(located: Located, out: Path) -> None:
    """facts.csv (subject, relation, answer as its first columns), heads.csv, head_tokens.csv,
    summary.json and the figures in `out`."""
    facts = located.facts.reset_index()
    write_csv(out / "facts.csv", facts)
    write_csv(out / "heads.csv", located.heads)
    if located.head_tokens is not None:
        write_csv(out / "head_tokens.csv", located.head_tokens.reset_index())
    write_summary(out / "summary.json", located.summary.to_json())
    plots.labels_per_relation(facts, out / "labels_per_relation.png")
    if located.head_tokens is not None:
        plots.head_token_heatmap(located.head_tokens, out / "head_tokens.png")
    plots.margin_scatter(facts, out / "margins.png")


def parser():
    p = cli.checkpoint_parser("locate_facts", __doc__, "the prompts and bootstrap intervals")
    p.add_argument("--facts", default=None, metavar="S:R,...",
                   help="measure these facts only, e.g. 3:1,7:0: their rows as in a run over every fact, at a "
                        "fraction of the cost (default out: a facts_S-R_... folder in the run's)")
    cli.add_settings(p, LocateSettings, "what is measured", exclude=("seed",))
    return p


def facts_folder(facts: list[tuple[int, int]]) -> str:
    """The folder name of a run over some facts: facts_3-1_7-0 (a digest beyond 8 facts)."""
    names = [f"{s}-{r}" for s, r in facts]
    if len(names) > 8:
        return f"facts_{len(names)}_{hashlib.sha1('_'.join(names).encode()).hexdigest()[:8]}"
    return "facts_" + "_".join(names)


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    settings = cli.settings(args, LocateSettings)
    model, task = load(args.ckpt, args.device, args.step, kind="factual_recall")
    facts = None if args.facts is None else parse_facts(args.facts, task)
    out = cli.out_dir(args, "CKPT/analysis/locate_facts")
    if args.out is None:  # beside the default settings' run over every fact, never over it
        out = out / recorded.settings_folder(settings) / (facts_folder(facts) if facts is not None else "")
    origin = recorded.source(args.ckpt, args.step)
    wanted = {"step": args.step, recorded.HASH: origin[recorded.HASH],
              "settings": measured_settings(settings, StorageRule(), facts)}
    recorded.refuse_other_results("locate_facts", out, wanted, args.ckpt, "locate_facts")
    located = locate(model, task, **asdict(settings), progress=not args.quiet, facts=facts)
    located = replace(located, summary=located.summary.from_checkpoint(origin))
    write(located, out)
    print(report(located, args.ckpt, out))
    return 0


if __name__ == "__main__":
    cli.run_cli(main)
