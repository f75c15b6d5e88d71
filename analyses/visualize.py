"""python -m analyses.visualize CKPT/ : circuitsvis attention views of chosen facts' prompts.

For each chosen fact (s, r), one prompt (random positions and noise, from --seed) is run
through the TransformerBridge model; its attention pattern, read from the hook
blocks.0.attn.hook_pattern ([head, query, key], probabilities), is drawn for every head
with circuitsvis.attention.attention_heads, the tokens labelled S3, R1, n17, EOS. A head x
token table (probe.denoising.head_token_table: the EOS query's mean attention on each
subject and relation over --contexts prompts per fact) says which heads pick which tokens.

The MLP, unit by unit: for the same prompts, the hidden units (hook blocks.0.mlp.hook_post)
that write most onto each fact's answer logit at EOS (activation x W_out[unit] . W_U[:, a*],
in logits; probe.neurons), as a fact x unit heat map and as circuitsvis's
text_neuron_activations view of every token.

Writes DIR/index.html (default CKPT/analysis/visualize): one self-contained page that
works offline (circuitsvis's inline script; never its CDN version), and DIR/views.json
(the checkpoint, the step and the content hash of the weights shown; per fact: tokens,
answer, prediction, each head's EOS attention on s and r, the shown MLP units' writes onto
a*); answers are named R1:a3 (relation 1's answer 3).
"""
from __future__ import annotations

import html
from dataclasses import asdict, dataclass, field, fields

import pandas as pd
import torch

from analyses import recorded
from analyses.sweeps import cli
from analyses.sweeps.output import write_summary
from models import load
from models.checkpoint import write_text
from models.out_folder import claim, only
from models.section import one_layer
from models.text import count
from probe.denoising import head_token_table
from probe.hooks import HOOK_PATTERN
from probe.neurons import top_units, unit_writes
from probe.prompts import checked_facts
from tasks.factual_recall import Batch, FactualRecallTask

N_DEFAULT_FACTS = 3
TOP_UNITS = 12  # MLP units shown in the neuron view


@dataclass(frozen=True)
class ViewSettings:
    """The prompts the views and the head x token table are read on."""

    contexts: int = field(default=8, metadata={"help": "prompts per fact for the head x token table"})
    seed: int = field(default=0, metadata={"help": "seed of the prompts"})

    def __post_init__(self):
        cli.at_least(self, contexts=1)


@dataclass(frozen=True)
class FactPrompt:
    """One prompt of a fact and what the model did with it."""

    subject: int
    relation: int
    answer: int  # a*(s, r)
    predicted: int  # argmax of the last-position logits
    tokens: list[str]  # [T] labels: S3, R1, n17, EOS
    ids: list[int]  # [T] their input ids
    pattern: list[list[list[float]]]  # [head, query, key] attention probabilities
    eos_on_subject: list[float]  # [head] the EOS query's attention on the subject
    eos_on_relation: list[float]  # [head] ... on the relation
    answer_name: str  # a*'s name: R1:a3, relation 1's answer 3
    predicted_name: str  # the prediction's

    @property
    def title(self) -> str:
        verdict = "correct" if self.predicted == self.answer else f"wrong: predicted {self.predicted_name}"
        return f"fact S{self.subject} R{self.relation} -> {self.answer_name} ({verdict})"


def parse_facts(text: str, task: FactualRecallTask) -> list[tuple[int, int]]:
    """'3:1,7:0' -> [(3, 1), (7, 0)]: facts of the task (probe.prompts.checked_facts), by the
    rule of every list flag (cli.list_items: none empty, none twice)."""
    def fact(item: str) -> tuple[int, int]:
        try:
            s, r = (int(p) for p in item.split(":"))
        except ValueError:
            raise ValueError(f"SUBJECT:RELATION pairs like 3:1,7:0 expected, got {item!r}") from None
        return s, r
    try:
        facts = cli.list_items(text, fact, what="fact")
    except ValueError as e:
        raise ValueError(f"--facts: {e}.") from None
    return checked_facts(task, facts)


def default_facts(task: FactualRecallTask, n: int = N_DEFAULT_FACTS) -> list[tuple[int, int]]:
    """`n` facts evenly spaced over the subject-major fact list (first and last included)."""
    n = min(n, task.n_facts)
    index = torch.linspace(0, task.n_facts - 1, n).round().long().unique()
    return [(int(i) // task.n_relations, int(i) % task.n_relations) for i in index]


def fact_prompts(model, task: FactualRecallTask, facts: list[tuple[int, int]], seed: int = 0) -> list[FactPrompt]:
    """One prompt per fact, run with run_with_cache; the pattern read from hook_pattern.
    A fact's prompt depends only on `seed` and the fact, not on the other facts shown."""
    device = next(model.parameters()).device
    generator = torch.Generator(device=device)
    prompts = [task.fact_prompts(torch.tensor([s]), torch.tensor([r]),
                                 generator.manual_seed(seed * task.n_facts + s * task.n_relations + r))
               for s, r in facts]
    batch = Batch(**{f.name: torch.cat([getattr(p, f.name) for p in prompts]) for f in fields(Batch)})
    with torch.inference_mode():
        logits, cache = model.run_with_cache(batch.tokens, names_filter=lambda name: name == HOOK_PATTERN)
    pattern = cache[HOOK_PATTERN].float().cpu()  # [n, head, query, key]
    predicted = logits[:, -1].argmax(-1).cpu()  # [n]
    rows = torch.arange(len(batch))
    on_subject = pattern[rows, :, -1, batch.subject_pos.cpu()]  # [n, head]
    on_relation = pattern[rows, :, -1, batch.relation_pos.cpu()]  # [n, head]
    tokens = batch.tokens.cpu()
    return [FactPrompt(s, r, int(batch.answers[i]), int(predicted[i]),
                       [task.token_label(int(z)) for z in tokens[i]], tokens[i].tolist(), pattern[i].tolist(),
                       _rounded(on_subject[i]), _rounded(on_relation[i]),
                       task.answer_label(int(batch.answers[i])), task.answer_label(int(predicted[i])))
            for i, (s, r) in enumerate(facts)]


def _rounded(values: torch.Tensor) -> list:
    """Nested lists of `values`, 4 decimals."""
    return torch.round(values.float().cpu(), decimals=4).tolist()


def attention_view(prompt: FactPrompt):
    """circuitsvis attention_heads view of every head on one prompt (causal mask shown)."""
    from circuitsvis.attention import attention_heads

    heads = len(prompt.pattern)
    return attention_heads(attention=prompt.pattern, tokens=prompt.tokens,
                           attention_head_names=[f"head {h}" for h in range(heads)],
                           max_value=1.0, min_value=0.0, mask_upper_tri=True)


def attention_views(model, task: FactualRecallTask, facts: list[tuple[int, int]] | None = None, seed: int = 0) -> list:
    """circuitsvis objects (one attention_heads view per fact) for a notebook. Show one with
    IPython.display.HTML(offline_html(view)), which needs no network, or cdn_html(view), a few
    kB (displaying the object itself first probes google.com to choose between the two)."""
    return [attention_view(p) for p in fact_prompts(model, task, facts or default_facts(task), seed)]


def offline_html(view) -> str:
    """The view's inline-script HTML (circuitsvis's whole script, about 1.3 MB) as a closed
    element, so several views can share a page."""
    return _closed(view.local_src)


def cdn_html(view) -> str:
    """The view's HTML that loads circuitsvis from its CDN (unpkg) when shown, as a closed
    element: a few kB, for a notebook saved with its outputs; it renders only with a network."""
    return _closed(view.cdn_src)


def _closed(src: str) -> str:
    """circuitsvis writes its container as `<div .../>`, which HTML parses as an open div: the
    rest of the page would land inside it and be wiped when React renders into it."""
    head, sep, tail = src.partition("/>")
    if not sep or not head.lstrip().startswith("<div"):
        raise RuntimeError("unexpected circuitsvis output: its container is not a self-closing <div/>.")
    return f"{head}></div>{tail}"


def head_token_html(table: pd.DataFrame) -> str:
    """An HTML heat map of a head x token table of attention masses (0..1), viridis colours."""
    return heat_html(table.rename(index=lambda head: f"head {head}"), "viridis", 0.0, 1.0)


def heat_html(table: pd.DataFrame, cmap_name: str, low: float, high: float) -> str:
    """An HTML heat map of a table (its index the row labels), values in [low, high] coloured
    by the matplotlib colour map `cmap_name`, two decimals."""
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    cmap = colormaps[cmap_name]
    header = "".join(f"<th>{html.escape(str(c))}</th>" for c in table.columns)
    rows = []
    for label, values in table.iterrows():
        cells = []
        for value in values:
            rgb = cmap((float(value) - low) / (high - low) if high > low else 0.5)
            ink = "#000" if 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] > 0.5 else "#fff"
            cells.append(f'<td style="background:{to_hex(rgb)};color:{ink}">{value:.2f}</td>')
        rows.append(f"<tr><th>{html.escape(str(label))}</th>{''.join(cells)}</tr>")
    return (f'<div class="wide"><table class="heat"><thead><tr><th></th>{header}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table></div>")


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.85em; }
th, td { border: 1px solid #ddd; padding: 3px 6px; text-align: right; }
table.heat td { min-width: 2.5em; }
th { white-space: nowrap; }
.wide { overflow-x: auto; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.5em 0; }
code { background: #f4f4f4; padding: 0 3px; }
.note { color: #666; }
"""


def page(title: str, body: str) -> str:
    """A whole HTML document; nothing in it is fetched from a network."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head>\n<body>\n<h1>{html.escape(title)}</h1>\n{body}\n</body></html>\n")


def views_section(prompts: list[FactPrompt], table: pd.DataFrame, heading: str = "h2",
                  notes: dict[tuple[int, int], str] | None = None) -> str:
    """HTML for the head x token table and one attention view per fact prompt; `notes`
    adds a word to a fact's heading (the report gives its storage label)."""
    parts = [f"<{heading}>Which heads pick which subject and relation</{heading}>",
             ('<p class="note">Mean attention of the EOS query on each subject (S) and relation (R) token, '
             "over the prompts that hold it (probe.denoising.head_token_table; 1 = all of it).</p>"),
             head_token_html(table),
             f"<{heading}>Attention patterns of single prompts</{heading}>",
             ('<p class="note">Every head of the one attention layer (hook <code>blocks.0.attn.hook_pattern</code>), '
             "query rows, key columns. The model is read at the last position (EOS): its row decides the answer. "
             "Click a head to enlarge it; hover for values.</p>")]
    for p in prompts:
        masses = ", ".join(f"head {h}: S {a:.2f} R {b:.2f}" for h, (a, b) in
                           enumerate(zip(p.eos_on_subject, p.eos_on_relation)))
        note = (notes or {}).get((p.subject, p.relation))
        parts += [f"<h3>{html.escape(p.title + (f'; stored in: {note}' if note else ''))}</h3>",
                  (f'<p class="note">prompt: <code>{html.escape(" ".join(p.tokens))}</code><br>'
                  f"EOS attention on the subject and the relation: {html.escape(masses)}</p>"),
                  offline_html(attention_view(p))]
    return "\n".join(parts)


@dataclass(frozen=True)
class UnitView:
    """The MLP's strongest units on the shown prompts: what each fires and writes."""

    units: list[int]  # [k] hidden units, strongest write first
    writes: list[list[float]]  # [fact, k] each unit's direct write onto a* at EOS (logits)
    activations: list[list[list[float]]]  # [fact, T, k] each unit's activation at every position
    onto_answer: list[list[list[float]]]  # [fact, T, k] activation x the unit's write onto a* per unit of it


def unit_view(model, prompts: list[FactPrompt], top: int = TOP_UNITS) -> UnitView | None:
    """The `top` units writing most onto the shown facts' answers (None without an MLP)."""
    if model.cfg.attn_only:
        return None
    tokens = torch.tensor([p.ids for p in prompts], device=next(model.parameters()).device)  # [n, T]
    answers = torch.tensor([p.answer for p in prompts])
    activations, direct = unit_writes(model, tokens, answers)  # [n, T, m], [n, m]
    units = top_units(activations[:, -1] * direct, top)
    chosen = activations[:, :, units]  # [n, T, k]
    onto_answer = chosen * direct[:, None, units]  # [n, T, k]
    return UnitView(units, _rounded(onto_answer[:, -1]), _rounded(chosen), _rounded(onto_answer))


def neuron_view(view: UnitView, prompts: list[FactPrompt]):
    """circuitsvis text_neuron_activations: per prompt and unit, the activation of every token
    (and what it writes onto a*), a drop-down per quantity and per unit."""
    from circuitsvis.activations import text_neuron_activations

    values = [torch.tensor([a, w]).permute(1, 0, 2) for a, w in zip(view.activations, view.onto_answer)]  # [T, 2, k]
    spaced = [[t if i == 0 else f" {t}" for i, t in enumerate(p.tokens)] for p in prompts]  # drawn as one text
    return text_neuron_activations(tokens=spaced, activations=values,
                                   first_dimension_name="quantity", second_dimension_name="unit",
                                   first_dimension_labels=["activation", "write onto a* (logits)"],
                                   second_dimension_labels=[f"unit {k}" for k in view.units])


def neurons_section(view: UnitView | None, prompts: list[FactPrompt], heading: str = "h2") -> str:
    """HTML for the MLP units: a fact x unit heat map of the writes onto a*, and the circuitsvis
    neuron view of the same prompts (a note when the model has no MLP)."""
    title = f"<{heading}>MLP units that fire and write each fact's answer</{heading}>"
    if view is None:
        return title + '<p class="note">None: the model is attention-only.</p>'
    table = pd.DataFrame(view.writes, columns=[f"unit {k}" for k in view.units],
                         index=[f"S{p.subject} R{p.relation} -> {p.answer_name}" for p in prompts])
    bound = max(float(table.abs().to_numpy().max()), 1e-6)
    return "\n".join([
        title,
        ('<p class="note">Each unit\'s direct write onto the answer logit a* at the last position (EOS): its '
         "activation (hook <code>blocks.0.mlp.hook_post</code>) times W_out[unit] &middot; W_U[:, a*], in logits "
         f"(probe.neurons.unit_writes); the {len(view.units)} units writing most onto these facts' answers, red "
         "for the answer, blue against it.</p>"),
        heat_html(table, "RdBu_r", -bound, bound),
        ('<p class="note">The same units on every token of each prompt (only the EOS row is read out): choose '
         "the quantity and the unit.</p>"),
        offline_html(neuron_view(view, prompts))])


def visualize(model, task: FactualRecallTask, facts: list[tuple[int, int]] | None = None, seed: int = 0,
              contexts: int = 8) -> tuple[list[FactPrompt], pd.DataFrame]:
    """The prompts of `facts` (default: a few, evenly spaced) and the head x token table."""
    prompts = fact_prompts(model, task, facts or default_facts(task), seed)
    return prompts, head_token_table(model, task, contexts, seed)


def parser():
    p = cli.checkpoint_parser("visualize", __doc__, "the prompts")
    p.add_argument("--facts", default=None, metavar="S:R,...",
                   help=f"facts to show, e.g. 3:1,7:0 (default: {N_DEFAULT_FACTS} evenly spaced over the fact table)")
    cli.add_settings(p, ViewSettings, "what is shown", exclude=("seed",))
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    settings = cli.settings(args, ViewSettings)
    model, task = load(args.ckpt, args.device, args.step, kind="factual_recall")
    one_layer(model.cfg.n_layers, args.ckpt, "visualize")
    facts = None if args.facts is None else parse_facts(args.facts, task)
    out = claim(cli.out_dir(args, "CKPT/analysis/visualize"), only("views.json", "index.html"), ckpt=args.ckpt)
    prompts, table = visualize(model, task, facts, settings.seed, settings.contexts)
    units = unit_view(model, prompts)
    body = (f'<p class="note">{html.escape(repr(task))}; checkpoint <code>{html.escape(str(args.ckpt))}</code>'
            f"{'' if args.step is None else f', step {args.step}'}</p>\n" + views_section(prompts, table)
            + "\n" + neurons_section(units, prompts))
    facts_shown = [{k: v for k, v in asdict(p).items() if k != "pattern"} for p in prompts]
    if units is not None:
        for shown, writes in zip(facts_shown, units.writes):
            shown["unit_writes"] = dict(zip(units.units, writes))
    write_summary(out / "views.json", {**recorded.source(args.ckpt, args.step), "seed": settings.seed,
                                       "facts": facts_shown})
    text = page("Attention and MLP views", body)
    write_text(out / "index.html", text)
    for p in prompts:
        print(f"{p.title}\n  EOS attention on S{p.subject} / R{p.relation}: " + ", ".join(
            f"head {h} {a:.2f} / {b:.2f}" for h, (a, b) in enumerate(zip(p.eos_on_subject, p.eos_on_relation))))
    print(f"wrote {out}/index.html ({len(text) / 1e6:.1f} MB: {count(len(prompts), 'attention view')}, head x token "
          f"table{'' if units is None else f', the {len(units.units)} MLP units writing most'}) and views.json")
    return 0


if __name__ == "__main__":
    cli.run_cli(main)
