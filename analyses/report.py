"""python -m analyses.report CKPT/ : one offline HTML page about a checkpoint.

DIR/index.html (default CKPT/analysis/report) shows the model and its training, the
locate_facts summary (where the facts live, with 95% intervals; recall probes; the heads
that pick the subject and the relation) with its figures, the attention views of a few
facts (one per storage label found, circuitsvis's inline script), the MLP units that write
those facts' answers (a heat map and circuitsvis's neuron view), one fact's edit before and
after (a rank-one write at each store, analyses/edit_view.py) and, when the checkpoint has
snapshots, the hallucination analysis.

Both analyses run with their default settings (locate_facts on the final weights). Results
recorded in DIR/NAME, or where the analyses write by default (CKPT/analysis/NAME), are reused
when they were computed from this checkpoint's very weights (the content hash their
summary.json records) with the report's settings (it says which it reuses, and names what
differs where it does not); otherwise, or with --fresh, the analysis runs and its results are
written to DIR/NAME, after every analysis has run: nothing is written when one fails, and
results of other weights or settings are never written over (a DIR/NAME that holds them is
refused; in the checkpoint's own folder, results of its earlier weights are replaced). A DIR
inside another checkpoint is refused.
Figures are embedded, so index.html is the whole report: it fetches nothing and opens from
any folder.
"""
from __future__ import annotations

import base64
import html
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import pandas as pd

from analyses import hallucination, locate_facts
from analyses.edit_view import edit_section
from analyses.locate_facts import LocateSettings
from analyses.recorded import HASH, read_summary, recorded_results, refuse_other_results, source
from analyses.sweeps import cli
from analyses.visualize import neurons_section, page, parse_facts, unit_view, views_section, visualize
from models import load
from models.checkpoint import read_config, snapshot_steps, snapshots_sha256, weights_sha256, write_text
from models.out_folder import claim, only
from models.section import ModelSection, one_layer
from probe import columns
from probe.phases import PhaseRule
from probe.storage import LABELS

LOCATE_FIGURES = {"labels_per_relation.png": "Storage label of every fact, per relation",
                  "margins.png": "Per fact: logit margin written by attention vs by the MLP",
                  "head_tokens.png": "Head x token attention of the EOS query"}


@dataclass(frozen=True)
class Needed:
    """An analysis the report shows: its folder and, unless recorded results are reused, how
    to compute it and write what it computed there."""

    folder: Path
    compute: Callable[[], object] | None = None
    write: Callable[[object], None] | None = None


def located_results(ckpt: Path, model, task, into: Path, fresh: bool = False, progress: bool = True,
                    say=print) -> Needed:
    """locate_facts on the final weights with the default settings: recorded results (`into`,
    or CKPT/analysis/locate_facts) when they were computed from these weights with these
    settings, else to be computed and written to `into` (refused, ValueError, where `into`
    holds other results)."""
    origin = source(ckpt)
    wanted = {"step": None, HASH: origin[HASH], "settings": locate_facts.measured_settings(LocateSettings())}
    found = recorded_results("locate_facts", [into, ckpt / "analysis" / "locate_facts"], wanted, fresh, say)
    if found is not None:
        return Needed(found)
    refuse_other_results("locate_facts", into, wanted, ckpt, "the report")

    def compute():
        located = locate_facts.locate(model, task, progress=progress)
        return replace(located, summary=located.summary.from_checkpoint(origin))
    return Needed(into, compute, lambda located: locate_facts.write(located, into))


def facts_to_show(facts: pd.DataFrame) -> list[tuple[int, int]]:
    """The first fact of each storage label present, in LABELS order."""
    firsts = facts.groupby("label", sort=False).head(1).set_index("label")
    return [(int(firsts.loc[label, "subject"]), int(firsts.loc[label, "relation"]))
            for label in LABELS if label in firsts.index]


def _image(path: Path, caption: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return (f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(caption)} (<code>{html.escape(path.name)}</code>)</figcaption></figure>")


def _table(rows: list[list], header: list[str]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _interval(x: dict, percent: bool = False) -> str:
    if percent:
        return f"{100 * x['value']:.1f}% [{100 * x['low']:.1f}, {100 * x['high']:.1f}]"
    return f"{x['value']:.3f} [{x['low']:.3f}, {x['high']:.3f}]"


def _short(value) -> str:
    """A summary value as short text: floats to 4 significant digits, containers as JSON."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)
    return str(value)


def model_section(ckpt: Path, config: dict, task) -> str:
    m, t = config["model"], config.get("training", {})
    rows = [["task", repr(task)],
            ["model", ModelSection.from_json(m).shape],
            ["training", ", ".join(f"{k}={t[k]:.4g}" if isinstance(t[k], float) else f"{k}={t[k]}"
                                   for k in ("optimizer", "lr", "seed", "steps_run", "final_accuracy", "final_loss")
                                   if k in t) or "not recorded"],
            ["snapshots", len(snapshot_steps(ckpt))]]
    if (ckpt / "model.safetensors").is_file():  # the hash the results shown were computed from
        rows.append(["weights", f"sha256 {weights_sha256(ckpt)}"])
    return "<h2>Model</h2>" + _table(rows, ["", ""])


INTERVALS = {"wilson": "Wilson", "bootstrap": "bootstrap"}  # summaries written before Wilson's: bootstrap


def locate_section(folder: Path) -> str:
    s = read_summary(folder / "summary.json")
    parts = ["<h2>Where the facts live (locate_facts)</h2>",
             (f'<p class="note">From <code>{html.escape(str(folder))}</code>, {s["n_facts"]} facts, '
              f"settings {html.escape(json.dumps(s.get('settings', {})))}"
              + (f", computed from the weights sha256 {s[HASH][:12]}..." if s.get(HASH) else "")
              + f". Intervals are 95% {INTERVALS[s.get('intervals', 'bootstrap')]} intervals over facts.</p>"),
             f"<p>accuracy {_interval(s['accuracy_interval'])}</p>",
             _table([[label, s["label_counts"][label], _interval(s["label_share_intervals"][label], percent=True)]
                     for label in LABELS], ["label", "facts", "share [95% CI]"])]
    probes = {**{f"{k} recall probe": v for k, v in s.get("recall", {}).items()},
              **{f"{k} path accuracy": v for k, v in s.get("path_accuracy", {}).items()}}
    if probes:
        parts.append(_table([[name, _interval(v)] for name, v in probes.items()],
                            ["measure", "mean over facts [95% CI]"]))
    heads_csv = folder / "heads.csv"
    if heads_csv.is_file():
        heads = pd.read_csv(heads_csv, keep_default_na=False).sort_values("denoising_score", ascending=False)
        parts += ["<h3>Heads (denoising: 1 = all of the EOS query's attention on the token, 0 = uniform)</h3>",
                  _table([[int(r.head), f"{r.subject_score:.2f}", f"{r.relation_score:.2f}", r.subjects or "-",
                           r.relations or "-"] for r in heads.itertuples()],
                         ["head", "subject score", "relation score", "subjects (>= 0.5)", "relations (>= 0.5)"])]
    parts += [_image(folder / name, caption) for name, caption in LOCATE_FIGURES.items() if (folder / name).is_file()]
    return "\n".join(parts)


def hallucination_results(ckpt: Path, into: Path, device: str = "auto", fresh: bool = False,
                          progress: bool = True, say=print) -> Needed | None:
    """The hallucination analysis with the default settings: recorded results (`into`, or
    CKPT/analysis/hallucination) when they were computed from these snapshots with these
    settings, else to be computed and written to `into` (refused where it holds other
    results); None without snapshots."""
    if not snapshot_steps(ckpt):
        return None
    wanted = {"snapshots_sha256": snapshots_sha256(ckpt), "settings": asdict(hallucination.HallucinationSettings()),
              "rule": asdict(PhaseRule())}
    found = recorded_results("hallucination", [into, ckpt / "analysis" / "hallucination"], wanted, fresh, say)
    if found is not None:
        return Needed(found)
    refuse_other_results("hallucination", into, wanted, ckpt, "the report")
    return Needed(into, lambda: hallucination.follow(ckpt, device=device, progress=progress),
                  lambda dynamics: hallucination.write(dynamics, into))


def hallucination_section(folder: Path | None) -> str:
    """The hallucination analysis's summary and figures, read from its output folder."""
    parts = ["<h2>Hallucination phase</h2>"]
    if folder is None:
        return parts[0] + '<p class="note">Absent: the checkpoint has no snapshots (train with '\
                          "<code>--snapshots-per-octave</code> &gt; 0 to study the training dynamics).</p>"
    s = read_summary(folder / "summary.json")
    phase = s.get("phase")
    if phase:
        parts += [(f"<p>Hallucination phase from step {phase.get('start_step')} to {phase.get('end_step')}: the model "
                  "answers from the relation alone (loss near log D) before it recalls the subject's answer.</p>"),
                  _table([[k, _short(v)] for k, v in phase.items()], ["phase", "value"])]
    else:
        parts.append("<p>No hallucination phase found in the training curves.</p>")
    rows = [[k, _short(v)] for k, v in s.items() if k != "phase"]
    parts.append(_table(rows, ["field", "value"]))
    parts += [_image(p, p.stem.replace("_", " ")) for p in sorted(folder.glob("*.png"))]
    csvs = sorted(p.name for p in folder.glob("*.csv"))
    if csvs:
        parts.append(f'<p class="note">Data: {", ".join(f"<code>{html.escape(c)}</code>" for c in csvs)} in '
                     f"<code>{html.escape(str(folder))}</code>.</p>")
    return "\n".join(parts)


def build(ckpt: str | Path, device: str = "auto", facts: str | None = None, fresh: bool = False,
          seed: int = 0, progress: bool = True, analyses: Path | None = None, say=print) -> str:
    """The report page (HTML) of a checkpoint; the analyses it needs are read from, or
    written to, `analyses`/locate_facts and `analyses`/hallucination (default
    CKPT/analysis/report), written only once both have run."""
    ckpt = Path(ckpt)
    analyses = ckpt / "analysis" / "report" if analyses is None else Path(analyses)
    model, task = load(ckpt, device, kind="factual_recall")
    one_layer(model.cfg.n_layers, ckpt, "report")
    config, _ = read_config(ckpt)
    given = None if facts is None else parse_facts(facts, task)  # refused before anything is written
    located = located_results(ckpt, model, task, analyses / "locate_facts", fresh, progress, say)
    dynamics = hallucination_results(ckpt, analyses / "hallucination", device, fresh, progress, say)
    to_run = [needed for needed in (dynamics, located) if needed is not None and needed.compute is not None]
    computed = [needed.compute() for needed in to_run]  # every analysis runs before any is written
    for needed, result in zip(to_run, computed):
        needed.write(result)
    facts_table = pd.read_csv(located.folder / "facts.csv")
    chosen = given or facts_to_show(facts_table)
    labels = {(int(s), int(r)): label for s, r, label in
              zip(facts_table[columns.SUBJECT], facts_table[columns.RELATION], facts_table[columns.LABEL])}
    prompts, table = visualize(model, task, chosen, seed)
    say("attention views of " + ", ".join(f"S{p.subject} R{p.relation}" + (
        f" ({labels[(p.subject, p.relation)]})" if (p.subject, p.relation) in labels else "") for p in prompts))
    body = "\n".join([(f'<p class="note">Checkpoint <code>{html.escape(str(ckpt))}</code>. '
                      "Everything on this page is in this one file: it opens offline.</p>"),
                      model_section(ckpt, config, task), locate_section(located.folder),
                      "<h2>Attention</h2>" + views_section(prompts, table, "h3", labels),
                      "<h2>MLP</h2>" + neurons_section(unit_view(model, prompts), prompts, "h3"),
                      edit_section(model, task, facts_table, seed=seed),
                      hallucination_section(None if dynamics is None else dynamics.folder)])
    return page(f"Report: {ckpt.name}", body)


def parser():
    p = cli.checkpoint_parser("report", __doc__, "the attention-view prompts", step=False)
    p.add_argument("--facts", default=None, metavar="S:R,...",
                   help="facts whose attention to show (default: the first fact of each storage label found)")
    p.add_argument("--fresh", action="store_true",
                   help="rerun locate_facts and the hallucination analysis even when results with the same "
                        "settings are recorded")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    out = claim(cli.out_dir(args, "CKPT/analysis/report"), only("index.html", "locate_facts", "hallucination"),
                ckpt=args.ckpt)
    text = build(args.ckpt, args.device, args.facts, args.fresh, args.seed, progress=not args.quiet, analyses=out)
    write_text(out / "index.html", text)
    print(f"wrote {out}/index.html ({len(text) / 1e6:.1f} MB, opens offline)")
    return 0


if __name__ == "__main__":
    cli.run_cli(main)
