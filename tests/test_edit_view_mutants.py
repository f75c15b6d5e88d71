"""The report page's editing section (analyses/edit_view.py) held to what it shows: which fact
it edits (by its storage label, skipping facts the model does not hold, at the head that
carries the subject), each store's before/after logits and effects, the figure's bars, and
the page's text (docs/testing.md, its mutation score)."""
import base64
import io

import pandas as pd
import pytest
import torch
from PIL import Image

from analyses import edit_view
from analyses.edit_view import before_after, chosen_fact, edit_section
from models import build_bridge
from models.cli import override
from models.recall.constructions import CONSTRUCTION_MODEL, CONSTRUCTION_TASK, build, build_storage, head_groups
from probe import columns
from probe.edit_effects import HELD_OUT
from probe.prompts import fact_batch

TASK = CONSTRUCTION_TASK.build()
STRUCTURED = override(CONSTRUCTION_TASK, {"facts": "structured"}).build()
PATCHED = [columns.patch("subject", columns.head(h)) for h in range(CONSTRUCTION_MODEL.n_heads)]


@pytest.fixture(scope="module")
def theorem4():
    return build_bridge(CONSTRUCTION_MODEL.checkpoint_section(TASK), build("mlp", TASK, CONSTRUCTION_MODEL), task=TASK)


@pytest.fixture(scope="module")
def theorem3():
    cfg = override(CONSTRUCTION_MODEL, {"attn_only": True})
    return build_bridge(cfg.checkpoint_section(TASK), build("attention", TASK, cfg), task=TASK)


@pytest.fixture(scope="module")
def planned():
    """Every fact in the MLP but 1:0 and 2:0, which the model does not hold."""
    plan = [["mlp"] * 4 for _ in range(8)]
    plan[1][0] = plan[2][0] = "none"
    weights = build_storage(STRUCTURED, CONSTRUCTION_MODEL, plan, 5.0, 5.0)
    return build_bridge(CONSTRUCTION_MODEL.checkpoint_section(STRUCTURED), weights, task=STRUCTURED)


def facts(rows, restored=None) -> pd.DataFrame:
    """locate_facts' columns for (subject, relation, label) rows, with each head's share
    restored when the subject is patched where `restored` gives them."""
    frame = pd.DataFrame(rows, columns=[columns.SUBJECT, columns.RELATION, columns.LABEL])
    if restored is not None:
        frame[PATCHED] = restored
    return frame


@pytest.mark.parametrize("labels, chosen", [
    (["attention", "distributed", "both", "mlp"], (3, 0)),
    (["attention", "distributed", "both", "not_stored"], (2, 0)),
    (["attention", "distributed", "unknown", "not_stored"], (1, 0)),
    (["unknown", "attention", "not_stored", "unknown"], (1, 0)),
])
def test_the_fact_shown_is_the_first_by_its_storage_label(theorem4, labels, chosen):
    rows = [(s, 0, label) for s, label in enumerate(labels)]
    assert chosen_fact(theorem4, TASK, facts(rows), 4, 0) == (*chosen, 0)  # no patching recorded: head 0


def test_the_fact_shown_is_one_the_model_holds_at_the_head_restoring_most(planned):
    restored = [[0.1, 0.2, 0.3, 0.05], [0.1, 0.2, 0.3, 0.05], [0.1, 0.7, 0.2, 0.0]]
    rows = [(1, 0, "mlp"), (2, 0, "mlp"), (5, 0, "mlp")]  # 1:0 and 2:0 not held: 5:0
    assert chosen_fact(planned, STRUCTURED, facts(rows, restored), 4, 0) == (5, 0, 1)
    assert chosen_fact(planned, STRUCTURED, facts(rows[:2], restored[:2]), 4, 0) is None
    page = edit_section(planned, STRUCTURED, facts(rows[:2], restored[:2]), contexts=4)
    assert page == "<h2>Editing</h2><p>The model holds none of its facts: there is nothing to edit.</p>"


def test_before_and_after_on_an_attention_only_model_show_the_ov_write_alone(theorem3):
    s, r, contexts, seed = 3, 1, 4, 2
    logits, effects = before_after(theorem3, TASK, s, r, 0, contexts, seed)
    old = int(TASK.facts[s, r])
    new = next(a for a in TASK.relation_answers(r) if a != old)  # the relation's first other answer
    assert list(logits.columns) == ["before", "after, at ov"] and list(effects.index) == ["ov"]
    assert list(logits.index) == [TASK.answer_label(a) + (" (old)" if a == old else " (new)" if a == new else "")
                                  for a in TASK.relation_answers(r)]
    tokens = fact_batch(TASK, contexts, seed + HELD_OUT).tokens  # the held-out prompts of the edited fact
    mine = tokens[(s * 4 + r) * contexts:(s * 4 + r + 1) * contexts]
    before = theorem3(mine)[:, -1].float().mean(0)[list(TASK.relation_answers(r))].detach()
    assert torch.allclose(torch.tensor(logits["before"].to_numpy()), before, atol=1e-5)
    after = logits["after, at ov"]
    assert after.idxmax() == TASK.answer_label(new) + " (new)" and after.sort_values().iloc[-1] - \
        after.sort_values().iloc[-2] == pytest.approx(2.0, abs=0.05)
    assert effects.loc["ov"].to_dict() == {"efficacy": 1.0, "kept": pytest.approx(1.0), "boost": 1.0}


def test_the_section_shows_each_store_s_write_its_figure_and_its_table(theorem4, monkeypatch):
    drawn, original = [], edit_view.subplots

    def subplots(*args, **kw):  # the figure's axes, kept to be read
        fig, ax = original(*args, **kw)
        drawn.append(ax)
        return fig, ax

    monkeypatch.setattr(edit_view, "subplots", subplots)
    restored = [[0.9, 0.0, 0.0, 0.0], [0.0, 0.1, 0.2, 0.9], [0.9, 0.0, 0.0, 0.0]]  # head 3 carries subject 3 here
    rows = [(0, 1, "not_stored"), (3, 1, "mlp"), (3, 0, "attention")]  # shown: 3:1 (its relation's, its subject's)
    page = edit_section(theorem4, TASK, facts(rows, restored), contexts=4, seed=0)
    logits, effects = before_after(theorem4, TASK, 3, 1, 3, 4, 0)
    assert page.startswith("<h2>Editing</h2><h3>S3 R1 (stored in: mlp) given another answer</h3>"
                           "<p>A rank-one write (ROME) at each store, the ov write at head 3; logits on held-out "
                           "contexts of the edited prompt (docs/editing.md).</p>")
    rows = "".join(f"<tr><td>{at}</td><td>{e['efficacy']:.2f}</td><td>{e['kept']:.3f}</td><td>{e['boost']:g}</td>"
                   "</tr>" for at, e in effects.iterrows())
    assert page.endswith("<figcaption>The relation's answers' logits before and after each write</figcaption>"
                         "</figure><table><thead><tr><th>store</th><th>efficacy</th><th>other facts kept</th>"
                         f"<th>boost</th></tr></thead><tbody>{rows}</tbody></table>")
    assert "<tr><td>mlp</td><td>1.00</td><td>1.000</td><td>1</td></tr>" in rows
    assert "<tr><td>ov</td><td>1.00</td>" in rows  # head 3 reads subject 3 (head 2's key for it is empty)
    png = Image.open(io.BytesIO(base64.b64decode(page.split('src="data:image/png;base64,')[1].split('"')[0])))
    (ax,) = drawn
    assert tuple(ax.figure.get_size_inches()) == (6, 3) and png.format == "PNG"
    assert tuple(round(d) for d in png.info["dpi"]) == (100, 100)
    assert png.size != (600, 300) and 300 < png.size[0] < 700  # 6 x 3 inches at 100 dpi, cropped to the drawing
    assert {t.get_fontsize() for t in [*ax.get_xticklabels(), *ax.get_legend().get_texts()]} == {8}
    bars = ax.patches  # one group per answer, one bar per column, centred on the answer's tick
    assert len(bars) == 4 * 3 and all(b.get_width() == pytest.approx(0.8 / 3) for b in bars)
    for i, column in enumerate(logits.columns):
        mine = bars[4 * i:4 * (i + 1)]
        assert [b.get_height() for b in mine] == pytest.approx(logits[column].tolist(), abs=1e-4)
        assert [b.get_x() + b.get_width() / 2 for b in mine] == pytest.approx([j + 0.8 / 3 * (i - 1) for j in range(4)])
    assert [t.get_text() for t in ax.get_xticklabels()] == list(logits.index)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(logits.columns)
    assert ax.get_title() == "S3 R1: the relation's answers" and ax.get_ylabel() == "logit (mean, held-out contexts)"


def test_a_fact_the_mlp_does_not_read_shows_the_ov_write_alone():
    """Fact 3:1 kept in attention, every other fact in the MLP: the MLP's key for 3:1 is empty,
    so its write is refused (EmptyKey) and the section goes on to the head that reads subject 3."""
    plan = [["mlp"] * 4 for _ in range(8)]
    plan[3][1] = "attention"
    model = build_bridge(CONSTRUCTION_MODEL.checkpoint_section(TASK), build_storage(TASK, CONSTRUCTION_MODEL, plan),
                         task=TASK)
    head = next(h for h, group in enumerate(head_groups(TASK, CONSTRUCTION_MODEL.n_heads)) if 3 in group)
    logits, effects = before_after(model, TASK, 3, 1, head, 4, 0)
    assert list(logits.columns) == ["before", "after, at ov"] and list(effects.index) == ["ov"]
    assert effects.loc["ov", "efficacy"] == 1.0
