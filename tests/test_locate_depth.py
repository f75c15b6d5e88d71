"""locate_facts at depth: on every deep construction (models.recall.deep_constructions) each fact's
label (layer, component, route) is its known store; a fact kept in two stores gets both; the paths
add up to the logits; the command line writes the depth columns and refuses bad input in one line."""
import json
from dataclasses import replace

import pandas as pd
import pytest
import torch

from analyses import locate_facts
from models.bridge import build_bridge
from models.recall.constructions import CONSTRUCTION_TASK
from models.recall.deep_constructions import DEPTH_MODEL, build_depth, plan_for, storage_of
from models.recall.deep_constructions import main as construct
from probe import columns
from probe.paths import Store, path_logits
from probe.prompts import FactPrompts
from tests.conftest import run_main

TASK = CONSTRUCTION_TASK.build()  # 8 subjects x 4 relations: 32 facts


def constructed(plan: list[list[str]], n_layers: int, swap_ov: list[list[str]] | None = None):
    """The bridge of a deep construction; with `swap_ov`, block 0's OV output rows are those `swap_ov`'s
    plan would write (its attention facts' answers), the rest as `plan` builds it."""
    cfg = replace(DEPTH_MODEL, n_layers=n_layers)
    w = build_depth(TASK, cfg, plan)
    if swap_ov is not None:
        w["blocks.0.attn.W_O"] = build_depth(TASK, cfg, swap_ov)["blocks.0.attn.W_O"]
    return build_bridge(cfg.checkpoint_section(TASK), w, task=TASK)


@pytest.mark.parametrize("n_layers", [2, 4])
@pytest.mark.parametrize("kind", ["last-mlp", "enriched", "mixed"])
def test_every_fact_of_every_deep_construction_is_labelled_with_its_known_store(kind, n_layers):
    """(a) last MLP, (b) block 0's MLP at the subject moved by block 1's heads, (c) a mix with block 0's
    OV: every fact's (layer, component, route) is where_stored's, and it is kept in that store alone."""
    plan = plan_for(kind, TASK)
    located = locate_facts.locate(constructed(plan, n_layers), TASK, contexts=4, progress=False)
    facts = located.facts.reset_index()
    for truth, (_, fact) in zip(storage_of(plan, n_layers), facts.iterrows(), strict=True):
        assert (fact[columns.SUBJECT], fact[columns.RELATION]) == (truth["s"], truth["r"])
        assert (fact[columns.LAYER], fact[columns.COMPONENT], fact[columns.ROUTE]) == (
            truth["layer"], truth["component"], truth["route"])
        store = Store(truth["layer"], truth["component"], (1,) if truth["route"] != "direct" else ())
        assert fact[columns.STORE_LIST] == store.name and fact[columns.LABEL] == truth["component"]
    # per head of the store's last layer: block 0's head holding the subject (head_groups), block 1's holding a*
    dh = DEPTH_MODEL.d_head
    for truth, (_, fact) in zip(storage_of(plan, n_layers), facts.iterrows()):
        if truth["store"] in ("attention", "enriched"):
            name, mine = ("attention0", truth["s"] % 3) if truth["store"] == "attention" else \
                ("mlp0_via_attention1", fact[columns.ANSWER] // dh)
            assert [fact[columns.top(f"{name}_{columns.head(h)}")] for h in range(4)] == [
                float(h == mine) for h in range(4)]
    summary = located.summary
    assert summary.label_counts["distributed"] == summary.label_counts["not_stored"] == 0
    kept = {name: store["facts"] for name, store in summary.stores.items() if store["facts"]}
    last = f"mlp{n_layers - 1}"
    # the candidates: every store that writes more than float noise (block 0's heads write the relations' blocks)
    assert list(summary.stores) == {"last-mlp": ["attention0", last], "enriched": ["attention0", "mlp0_via_attention1"],
                                    "mixed": ["attention0", "mlp0_via_attention1", last]}[kind]
    assert kept == {"last-mlp": {last: 32}, "enriched": {"mlp0_via_attention1": 32},
                    "mixed": {"attention0": 11, "mlp0_via_attention1": 10, last: 11}}[kind]
    assert summary.stores.get("mlp0_via_attention1", {"route": "moved by layer 1 heads"})["route"] == \
        "moved by layer 1 heads"


def test_a_fact_kept_in_two_stores_gets_both_in_its_stores_list_and_no_single_layer():
    """Fact (0, 0), kept in block 0's OV by the mixed plan, also in the last MLP (a unit of its own):
    `both`, stores attention0;mlp1, no layer, component or route; the other facts keep their one store."""
    mixed = plan_for("mixed", TASK)
    assert mixed[0][0] == "attention"
    in_mlp = [row[:] for row in mixed]
    in_mlp[0][0] = "mlp"
    in_attention = [row[:] for row in mixed]
    in_attention[0][0] = "attention"
    located = locate_facts.locate(constructed(in_mlp, 2, swap_ov=in_attention), TASK, contexts=4, progress=False)
    fact = located.facts.loc[(0, 0)].iloc[0]
    assert (fact[columns.LABEL], fact[columns.STORE_LIST]) == ("both", "attention0;mlp1")
    assert pd.isna(fact[columns.LAYER]) and pd.isna(fact[columns.COMPONENT]) and pd.isna(fact[columns.ROUTE])
    others = located.facts.iloc[1:]
    assert (others[columns.STORE_LIST].str.count(";") == 0).all()
    assert located.summary.stores["attention0"]["facts"] == 11 and located.summary.stores["mlp1"]["facts"] == 12


@pytest.mark.parametrize("n_layers", [2, 3])
def test_the_paths_add_up_to_the_logits_and_a_later_head_moves_an_earlier_write(n_layers):
    """Random weights with every bias: direct + every store's write = the model's logits at EOS, and the
    stores are each layer's attention and MLP with every chain of later movers."""
    cfg = replace(DEPTH_MODEL, n_layers=n_layers, d_model=16)
    g = torch.Generator().manual_seed(0)
    from models.recall.weights import init_weights

    w = {k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in init_weights(cfg, TASK, 0).items()}
    model = build_bridge(cfg.checkpoint_section(TASK), w, task=TASK)
    writes = path_logits(model, FactPrompts.build(model, TASK, 2, 0).batch, chunk=24)
    total = writes.direct + sum(writes.stores.values())
    assert (total - writes.logits).abs().max() <= 1e-4 * writes.logits.abs().max()
    names = sorted(store.name for store in writes.stores)
    expected = {2: ["attention0", "attention0_via_attention1", "attention1", "mlp0", "mlp0_via_attention1", "mlp1"],
                3: ["attention0", "attention0_via_attention1", "attention0_via_attention1_via_attention2",
                    "attention0_via_attention2", "attention1", "attention1_via_attention2", "attention2", "mlp0",
                    "mlp0_via_attention1", "mlp0_via_attention1_via_attention2", "mlp0_via_attention2", "mlp1",
                    "mlp1_via_attention2", "mlp2"]}[n_layers]
    assert names == expected
    heads = sum(writes.heads[(Store(0, "mlp", (1,)), h)] for h in range(cfg.n_heads))
    assert torch.allclose(heads, writes.stores[Store(0, "mlp", (1,))], atol=1e-5)
    assert Store(0, "mlp", (1, 2)).route == "moved by layers 1, 2 heads"


@pytest.mark.parametrize("n_layers", [1, 2])
def test_the_margins_are_direct_logit_attribution_s_and_the_stores_parts_add_up_to_them(n_layers):
    """On a random model: `margin` and its interval are direct_logit_attribution's (a* over the model's
    rival, the prompts' bootstrap), and at one layer (b_V = 0, which paths count as direct and the heads'
    results as attention) each component's part too; every store's part adds up to attention_margin +
    mlp_margin, and with direct_margin to the margin."""
    from models.recall.weights import init_weights
    from probe.attribution import direct_logit_attribution
    from probe.paths import path_measurements

    cfg = replace(DEPTH_MODEL, n_layers=n_layers, d_model=16)
    g = torch.Generator().manual_seed(1)
    w = {k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in init_weights(cfg, TASK, 0).items()}
    if n_layers == 1:
        w["blocks.0.attn.b_V"].zero_()
    model = build_bridge(cfg.checkpoint_section(TASK), w, task=TASK)
    prompts = FactPrompts.build(model, TASK, 4, 3)
    facts, stores, _ = path_measurements(model, TASK, prompts)
    reference = direct_logit_attribution(model, TASK, prompts=prompts)
    same = [*columns.interval(columns.MARGIN)]  # the bootstrap draws from the seed and the column's name
    if n_layers == 1:
        same += [columns.margin("mlp0"), columns.margin("attention0")]
        same += [c for part in ("attention", "mlp", "direct") for c in columns.interval(columns.margin(part))]
    for name in same:
        reference_name = name.replace("mlp0", "mlp").replace("attention0", "attention")
        assert torch.allclose(torch.tensor(facts[name].to_numpy()), torch.tensor(reference[reference_name].to_numpy()),
                              atol=1e-4), name
    assert facts[columns.MARGIN].std() > 0.1 and (facts["margin_high"] - facts["margin_low"]).min() > 0
    parts = {c: facts[columns.margin(c)] for c in ("attention", "mlp", "direct")}
    for component in ("attention", "mlp"):
        mine = sum(facts[columns.margin(s.name)] for s in stores if s.component == component)
        assert (mine - parts[component]).abs().max() < 1e-4 and parts[component].abs().max() > 0.01
    assert (sum(parts.values()) - facts[columns.MARGIN]).abs().max() < 1e-4


def test_the_command_line_writes_the_depth_columns_and_refuses_bad_input_in_one_line(tmp_path, capsys):
    ckpt = tmp_path / "mixed"
    assert run_main(construct, ["--kind", "mixed", "--out", ckpt], capsys)[0] == 0
    code, out, _ = run_main(locate_facts.main, [ckpt, "--contexts", "2", "--quiet", "--device", "cpu"], capsys)
    assert code == 0
    assert "  layer 0 attention      11   34.4%" in out
    assert "  mlp0_via_attention1             10  moved by layer 1 heads" in out
    folder = ckpt / "analysis" / "locate_facts" / "contexts-2"
    facts = pd.read_csv(folder / "facts.csv")
    assert {columns.LAYER, columns.COMPONENT, columns.ROUTE, columns.STORE_LIST} <= set(facts.columns)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["layer_components"]["layer 1 mlp"]["value"] == 11 / 32
    assert {(h["layer"], h["head"]) for h in summary["top_heads"]} == {(l, h) for l in range(2) for h in range(4)}
    code, out, _ = run_main(locate_facts.main, [ckpt, "--facts", "1:2", "--contexts", "2", "--quiet",
                                                "--device", "cpu"], capsys)
    assert code == 0 and "fact S1 R2 -> " in out and ": mlp (mlp0_via_attention1); accuracy 1.000" in out
    for argv, says in ((["--facts", "8:0"], "outside the task"), (["--contexts", "1"], "--contexts must be >= 2")):
        code, _, err = run_main(locate_facts.main, [ckpt, *argv, "--quiet", "--out", tmp_path / "bad"], capsys)
        assert code == 2 and err.startswith("error:") and says in err and len(err.strip().splitlines()) == 1
        assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("ratio, facts", [((5.0, 5.0), "structured"), ((5.0, 15.0), "structured"),
                                          ((15.0, 5.0), "structured"), ((5.0, 5.0), "random")],
                         ids=["1:1", "1:3", "3:1", "1:1-random-answers"])
def test_at_one_layer_the_paths_with_the_one_layer_mean_give_the_one_layer_rule_s_labels(ratio, facts):
    """The one-layer rule is the paths' rule at L = 1: on tests/test_storage_rule.py's one-layer plan (each
    fact in attention, the MLP, both or neither), every store's paths judged with the other stores at
    their mean over every prompt label each fact as locate_facts' one-layer pipeline does, as planned, and
    give its path accuracies (balanced answers, and random ones, whose mean write favours common answers)."""
    from models.cli import override
    from models.recall.constructions import CONSTRUCTION_MODEL, build_storage
    from probe.accuracy import per_fact_accuracy
    from probe.paths import path_measurements
    from probe.storage import StorageRule, stores_of
    from tests.test_storage_rule import EXPECTED

    task = override(CONSTRUCTION_TASK, {"facts": facts}).build()
    pattern = ["attention", "mlp", "both", "mlp", "both", "attention", "none", "both"]
    plan = [[pattern[(s * 4 + r) % 8] for r in range(4)] for s in range(8)]
    model = build_bridge(CONSTRUCTION_MODEL.checkpoint_section(task), build_storage(task, CONSTRUCTION_MODEL, plan,
                                                                                    *ratio))
    one_layer = locate_facts.locate(model, task, contexts=4, patch_contexts=1, progress=False).facts
    prompts = FactPrompts.build(model, task, 4, 0)
    paths, stores, _ = path_measurements(model, task, prompts, relation_mean=False)
    measured = pd.concat([per_fact_accuracy(model, task, prompts=prompts), paths], axis=1)
    labels = stores_of(StorageRule(), measured, stores)[columns.LABEL]
    assert list(labels) == list(one_layer[columns.LABEL])
    assert list(labels) == [EXPECTED[x] for row in plan for x in row]
    assert [s.name for s in stores] == ["attention0", "mlp0"]
    for component in columns.STORES:  # the one-layer path runs (probe/ablation.py), read off the paths
        assert (paths[columns.path_accuracy(f"{component}0")] == one_layer[columns.path_accuracy(component)]).all()
    assert 0 < one_layer[columns.path_accuracy("attention")].mean() < 1


def test_chosen_facts_get_their_rows_of_the_run_over_every_fact_and_each_layer_s_heads_their_attention():
    """--facts at depth: the chosen facts' path columns are their rows of the run over every fact. The
    mixed construction's heads: block 0's subject heads see their group's share of the subjects, its
    relation head every relation, block 1's heads every subject (denoising score 1)."""
    from probe.paths import head_table, path_measurements

    model = constructed(plan_for("mixed", TASK), 2)
    every, _, writes = path_measurements(model, TASK, FactPrompts.build(model, TASK, 4, 0))
    chosen, _, _ = path_measurements(model, TASK, FactPrompts.build(model, TASK, 4, 0, facts=[(3, 1), (0, 2)]))
    pd.testing.assert_frame_equal(chosen, every.loc[chosen.index])
    assert list(chosen.index.droplevel(columns.ANSWER)) == [(3, 1), (0, 2)]
    T = TASK.seq_len
    heads = head_table(writes, 2, T).set_index(["layer", "head"])
    # a subject head of block 0 holds a share g of the subjects (head_groups): on the other prompts it
    # attends uniformly, 1/T on each position
    expected = {(0, h): (g + (1 - g) / T, (1 - g) / T) for h, g in enumerate((3 / 8, 3 / 8, 2 / 8))}
    expected.update({(0, 3): (0, 1), **{(1, h): (1, 0) for h in range(4)}})
    for (layer, h), (subject, relation) in expected.items():
        row = heads.loc[(layer, h)]
        assert abs(row.subject_mass - subject) < 1e-6 and abs(row.relation_mass - relation) < 1e-6
        scores = [(subject - 1 / T) / (1 - 1 / T), (relation - 1 / T) / (1 - 1 / T)]
        assert abs(row.subject_score - scores[0]) < 1e-6 and abs(row.relation_score - scores[1]) < 1e-6
        assert abs(row.denoising_score - max(scores)) < 1e-6


def test_at_depth_the_progress_bar_counts_every_path_run_and_ends_at_its_total(monkeypatch):
    """locate's bar at depth: one step per run of the model over a chunk of every fact's prompts (512
    prompts: 2 runs of 256) and one for the stores' measurements, closed at its total; --quiet disables it."""
    import analyses.locate_facts as module
    from probe import paths
    from probe.paths import n_path_runs

    bars = []

    class Bar:
        def __init__(self, **kwargs):
            self.kwargs, self.n, self.closed = kwargs, 0, False
            bars.append(self)

        def update(self, n):
            assert not self.closed
            self.n += n

        def close(self):
            self.closed = True

    monkeypatch.setattr(module, "progress_bar", Bar)
    model = constructed(plan_for("enriched", TASK), 2)
    runs, split = [], paths._split  # path_logits splits each run's cache once
    monkeypatch.setattr(paths, "_split", lambda model, cache, where: runs.append(len(where[0])) or split(model, cache,
                                                                                                       where))
    module.locate(model, TASK, contexts=16, facts=[(3, 1)])
    assert runs == [256, 256] and n_path_runs(FactPrompts.build(model, TASK, 16, 0, facts=[(3, 1)])) == 2
    assert [(b.kwargs, b.n, b.closed) for b in bars] == [
        ({"total": 3, "desc": "locating facts", "unit": "run", "disable": False}, 3, True)]
    bars.clear()
    module.locate(model, TASK, contexts=4, progress=False)
    assert [(b.kwargs["total"], b.kwargs["disable"], b.n, b.closed) for b in bars] == [(2, True, 2, True)]


def test_the_report_at_depth_gives_each_label_place_and_store_in_whole_lines_and_each_chosen_fact_s_stores():
    """The mixed construction with fact (0, 0) unknown (`none`): 10 facts in block 0's OV, 10 enriched,
    11 in the last MLP, one in no store; each count's share with its Wilson interval over the 32 facts,
    the stores holding none left out, and the chosen facts' labels and stores."""
    from pathlib import Path

    plan = plan_for("mixed", TASK)
    plan[0][0] = "none"
    model = constructed(plan, 2)

    def report(facts=None, **stores):
        located = locate_facts.locate(model, TASK, contexts=2, progress=False, facts=facts)
        s = located.summary
        assert s.settings["device"] == "cpu" and s.task == repr(TASK) and s.n_facts == len(facts or range(32))
        assert isinstance(s.seconds, float) and 0 < s.seconds == round(s.seconds, 2) < 600
        assert list(located.facts.reset_index().columns[:4]) == ["subject", "relation", "answer", "answer_name"]
        located = replace(located, summary=replace(s, seconds=1.26, stores={**s.stores, **stores}))
        return locate_facts.report(located, "ckpt/mixed", Path("out")).splitlines()

    assert report() == [
        "ckpt/mixed: 32 facts, accuracy 0.969 [95% CI 0.843, 0.994]",
        "where the facts live:",
        "  attention       10   31.2%  [18.0, 48.6]",
        "  mlp             21   65.6%  [48.3, 79.6]",
        "  both             0    0.0%  [0.0, 10.7]",
        "  distributed      0    0.0%  [0.0, 10.7]",
        "  not_stored       1    3.1%  [0.6, 15.7]",
        "by layer and component (layers from 0; a fact kept in several stores counts in each):",
        "  layer 0 attention      10   31.2%  [18.0, 48.6]",
        "  layer 0 mlp            10   31.2%  [18.0, 48.6]",
        "  layer 1 mlp            11   34.4%  [20.4, 51.7]",
        "by store and route:",
        "  attention0                      10  direct",
        "  mlp0_via_attention1             10  moved by layer 1 heads",
        "  mlp1                            11  direct",
        "wrote out/ (facts.csv, heads.csv, summary.json, figures) in 1.3 s"]
    # a store's name longer than the column (at L = 4: mlp0_via_attention1_via_attention2) widens it
    long = {"facts": 3, "route": "moved by layers 1, 2 heads"}
    assert report(mlp0_via_attention1_via_attention2=long)[12:14] == [
        "  attention0                              10  direct",
        "  mlp0_via_attention1                     10  moved by layer 1 heads"]
    chosen = report([(0, 0), (1, 2)])
    assert chosen[0] == "ckpt/mixed: 2 facts, accuracy 0.500 [95% CI 0.095, 0.905]"
    assert chosen[9:] == [
        "  layer 0 mlp             1   50.0%  [9.5, 90.5]",
        "  layer 1 mlp             0    0.0%  [0.0, 65.8]",
        "by store and route:",
        "  mlp0_via_attention1              1  moved by layer 1 heads",
        "fact S0 R0 -> R0:a0: not_stored (no store); accuracy 0.000",
        "fact S1 R2 -> R2:a3: mlp (mlp0_via_attention1); accuracy 1.000",
        "wrote out/ (facts.csv, heads.csv, summary.json, figures) in 1.3 s"]


def test_a_model_that_writes_nothing_has_no_store_and_its_report_lists_none():
    """All weights zero: every store is silent, so no candidate, no place and no store in the summary;
    the report's two sections are empty."""
    from pathlib import Path

    from models.recall.weights import init_weights

    cfg = replace(DEPTH_MODEL, n_layers=2)
    w = {k: torch.zeros_like(v) for k, v in init_weights(cfg, TASK, 0).items()}
    located = locate_facts.locate(build_bridge(cfg.checkpoint_section(TASK), w, task=TASK), TASK, contexts=2,
                                  progress=False)
    assert located.summary.stores == located.summary.layer_components == {}
    located = replace(located, summary=replace(located.summary, seconds=0.5))
    assert locate_facts.report(located, "zero", Path("out")).splitlines()[7:] == [
        "by layer and component (layers from 0; a fact kept in several stores counts in each):",
        "by store and route:", "wrote out/ (facts.csv, heads.csv, summary.json, figures) in 0.5 s"]


@pytest.mark.parametrize("n_layers", [1, 2])
def test_the_summary_records_each_store_s_share_and_the_heads_best_first(n_layers):
    """summary.json on the mixed construction (L = 2) and a random one-layer model: per store its layer,
    component, route, facts kept and share with its Wilson interval over the 32 facts; the accuracy, the
    label shares (summing to 1), each store's path accuracy; every head, best denoising score first."""
    from probe.stats import wilson_interval

    if n_layers == 2:
        model = constructed(plan_for("mixed", TASK), 2)
    else:
        from models.recall.weights import init_weights

        cfg = replace(DEPTH_MODEL, n_layers=1, d_model=16)
        g = torch.Generator().manual_seed(2)
        w = {k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in init_weights(cfg, TASK, 0).items()}
        model = build_bridge(cfg.checkpoint_section(TASK), w, task=TASK)
    located = locate_facts.locate(model, TASK, contexts=2, patch_contexts=1, progress=False)
    summary = located.summary.to_json()
    assert summary["accuracy"] == pytest.approx(located.facts[columns.ACCURACY].mean(), abs=1e-12)
    assert sum(summary["label_shares"].values()) == pytest.approx(1, abs=1e-12)
    scores = [h["denoising_score"] for h in summary["top_heads"]]
    assert all(isinstance(x, float) for h in summary["top_heads"] for x in (h["denoising_score"], h["subject_score"],
                                                                           h["relation_score"]))
    assert scores == sorted(scores, reverse=True) and len(set(scores)) > 1
    if n_layers == 1:
        assert set(summary["path_accuracy"]) == {"attention", "mlp"}
        return
    low, high = wilson_interval(torch.tensor(10 / 32), 32)
    assert summary["stores"]["mlp0_via_attention1"] == pytest.approx(
        {"layer": 0, "component": "mlp", "route": "moved by layer 1 heads", "facts": 10, "share": 10 / 32,
         "low": float(low), "high": float(high)}, abs=1e-6)
    assert summary["recall"] == {} and set(summary["path_accuracy"]) == set(summary["stores"])
