"""The parts of causal tracing one at a time: the corruption's size and place, the prompts of
chosen facts, the chunks, the two readings (peak, severed) and what the command records."""
import json

import pandas as pd
import pytest
import torch

import probe.causal_tracing as tracing
from probe.causal_tracing import causal_trace, peaks, severed_stores, tracing_prompts
from probe.prompts import fact_batch
from tests.conftest import run_main
from tests.test_causal_tracing import FACTS, FLOAT, TASK, at, constructed

T = TASK.seq_len


def test_the_roles_run_subject_relation_the_noise_left_to_right_then_last():
    batch = fact_batch(TASK, 2, 3)
    order = tracing.role_order(batch, T)  # [n, T]
    assert tracing.slot_roles(T) == ["subject", "relation"] + ["noise"] * (T - 3) + ["last"]
    for i in range(len(batch)):
        s, r = int(batch.subject_pos[i]), int(batch.relation_pos[i])
        noise = [p for p in range(T - 1) if p not in (s, r)]
        assert order[i].tolist() == [s, r, *noise, T - 1]


def test_chosen_facts_get_the_prompts_they_get_among_all_in_the_order_given():
    every = fact_batch(TASK, 2, 5)
    batch, index = tracing_prompts(TASK, 2, 5, facts=[(3, 1), (0, 2)])
    rows = [2 * (3 * 4 + 1), 2 * (3 * 4 + 1) + 1, 2 * 2, 2 * 2 + 1]  # fact s * R + r, 2 contexts each
    for name in ("tokens", "subjects", "relations", "answers", "subject_pos", "relation_pos"):
        assert torch.equal(getattr(batch, name), getattr(every, name)[rows])
    assert list(index) == [(3, 1, int(TASK.facts[3, 1])), (0, 2, int(TASK.facts[0, 2]))]
    whole, all_index = tracing_prompts(TASK, 2, 5)
    assert torch.equal(whole.tokens, every.tokens) and len(all_index) == 32


def smooth_model():
    """Two blocks of random weights whose P(a*) moves smoothly with the embeddings (a construction's
    saturates: 3 sigma of noise or 6 leave it at 0 or 1 alike)."""
    from models import build_bridge
    from models.section import InductionSection

    section = InductionSection("generic", 2, 16, 2, 8, 32, "all", None, TASK.seq_len, TASK.d_vocab, TASK.d_vocab_out)
    generator = torch.Generator().manual_seed(0)
    weights = {k: 0.3 * torch.randn(shape, generator=generator) for k, shape in section.weight_shapes().items()}
    weights["unembed.W_U"] *= 0.1  # logits of order 1
    return build_bridge(section, weights)


@pytest.mark.parametrize("corrupt", ["subject", "relation"])
def test_the_noise_is_three_times_the_corrupted_kind_s_embedding_std_added_at_its_token(corrupt):
    """One draw by hand: the corrupted probability is P(a*) with N(0, (3 sigma)^2) added to the
    token's embedding, sigma the std of every subject's (relation's) W_E row entries."""
    model = smooth_model()
    rows = list(range(8)) if corrupt == "subject" else [8 + r for r in range(4)]  # relation r is token S + r
    other = [8 + r for r in range(4)] if corrupt == "subject" else list(range(8))
    with torch.no_grad():
        model.W_E[other] *= 2  # the other kind's embeddings spread twice as wide: a std of the wrong rows shows
    sigma = float(model.W_E.detach()[rows].std())
    assert tracing.noise_std(model, TASK, corrupt) == pytest.approx(sigma, rel=1e-6)
    assert tracing.noise_std(model, TASK) == tracing.noise_std(model, TASK, "subject")  # the subject by default
    effects = causal_trace(model, TASK, torch.Generator().manual_seed(7), 1, 0, FACTS, 1, corrupt)
    batch, _ = tracing_prompts(TASK, 1, 0, FACTS)
    draw = torch.randn(len(batch), model.cfg.d_model, generator=torch.Generator().manual_seed(7)) * 3 * sigma
    position = batch.subject_pos if corrupt == "subject" else batch.relation_pos

    def add(x, hook):
        x = x.clone()
        x[torch.arange(len(batch)), position] += draw
        return x

    def p(logits):
        return logits[:, -1].softmax(-1)[torch.arange(len(batch)), batch.answers]

    with torch.inference_mode():
        clean = p(model(batch.tokens))
        corrupted = p(model.run_with_hooks(batch.tokens, fwd_hooks=[("hook_embed", add)]))
    per_fact = effects.drop_duplicates("fact")
    assert (per_fact["clean_probability"].to_numpy() - clean.numpy()).max() < FLOAT
    assert abs(per_fact["corrupted_probability"].to_numpy() - corrupted.numpy()).max() < FLOAT
    assert (clean - corrupted).abs().max() > 1e-3  # the noise matters: a wrong scale or place shows


def test_the_function_s_defaults_are_the_command_s_two_contexts_and_seed_0():
    model = smooth_model()  # a construction's P(a*) is the same 0 or 1 in every context
    default = causal_trace(model, TASK, torch.Generator().manual_seed(0), facts=[(2, 1)], draws=1, noise="resample")
    given = causal_trace(model, TASK, torch.Generator().manual_seed(0), 2, 0, [(2, 1)], 1, noise="resample")
    pd.testing.assert_frame_equal(default, given, check_exact=True)
    other = causal_trace(model, TASK, torch.Generator().manual_seed(0), 3, 0, [(2, 1)], 1, noise="resample")
    seeded = causal_trace(model, TASK, torch.Generator().manual_seed(0), 2, 1, [(2, 1)], 1, noise="resample")
    assert not other["clean_probability"].equals(given["clean_probability"])  # the contexts matter
    assert not seeded["clean_probability"].equals(given["clean_probability"])  # and the prompts' seed


def test_prompts_are_traced_in_chunks_that_meet_inside_a_fact(monkeypatch):
    """Chunks of 3 prompts over 2 facts x 2 contexts: each prompt's numbers land on its own
    fact, and progress is called once per chunk and draw (n_steps)."""
    model = constructed("mlp")
    facts = [(1, 1), (6, 3)]
    whole = causal_trace(model, TASK, torch.Generator().manual_seed(0), 2, 0, facts, 2, noise="resample")
    monkeypatch.setattr(tracing, "PROMPTS_PER_RUN", 3)
    calls, sizes, run_with_cache = [], [], model.run_with_cache

    def counted(tokens, **kwargs):  # [n, T]
        sizes.append(len(tokens))
        return run_with_cache(tokens, **kwargs)

    monkeypatch.setattr(model, "run_with_cache", counted)
    chunked = causal_trace(model, TASK, torch.Generator().manual_seed(0), 2, 0, facts, 2, noise="resample",
                           progress=lambda: calls.append(1))
    assert len(calls) == tracing.n_steps(2, 2, 2) == 4
    assert sizes == [3, 3, 3, 1, 1, 1]  # per chunk: the clean run, then one corrupted run per draw
    pd.testing.assert_series_equal(chunked["clean_probability"], whole["clean_probability"])
    per_fact = chunked.drop_duplicates("fact").set_index("fact")
    assert list(per_fact.index) == ["1:1", "6:3"]
    lost = per_fact["clean_probability"] - per_fact["corrupted_probability"]
    assert lost.min() > 0.5 and (at(chunked, "resid", 0, "subject") - lost).abs().max() < FLOAT
    assert (at(chunked, "mlp", 1, "last") - lost).abs().max() < FLOAT


def test_n_steps_counts_chunks_of_256_prompts_times_draws():
    assert tracing.n_steps(64, 2, 10) == 10 and tracing.n_steps(128, 2, 3) == 3 and tracing.n_steps(129, 2, 3) == 6
    assert tracing.n_steps(32, 2) == 10  # DRAWS by default


@pytest.mark.parametrize("kwargs, says", [({"corrupt": "object"}, "corrupt must be one of subject, relation"),
                                          ({"noise": "uniform"}, "noise must be one of gaussian, resample"),
                                          ({"draws": 0}, "draws must be >= 1, got 0")])
def test_causal_trace_refuses_a_bad_setting_before_it_traces(kwargs, says):
    with pytest.raises(ValueError, match=says):
        causal_trace(None, TASK, torch.Generator(), facts=FACTS, **kwargs)


def test_with_the_mlps_or_the_attention_severed_the_last_hidden_state_still_restores_everything():
    """Theorem 4 under resampling: the last hidden state follows every frozen output, so restoring
    it brings all back; restoring the subject's embedding through frozen heads brings nothing."""
    effects = causal_trace(constructed("mlp"), TASK, torch.Generator().manual_seed(0), 1, 0, FACTS, 1,
                           noise="resample")
    per_fact = effects.drop_duplicates("fact").set_index("fact")
    lost = per_fact["clean_probability"] - per_fact["corrupted_probability"]
    for severed in ("resid_severed_mlp", "resid_severed_attn"):
        assert (at(effects, severed, 1, "last") - lost).abs().max() < FLOAT
    assert at(effects, "resid_severed_attn", 0, "subject").abs().max() < FLOAT
    assert (at(effects, "resid", 0, "subject") - lost).abs().max() < FLOAT


def rows(fact, component, layer, position, effect):
    return {"fact": fact, "layer": layer, "position": position, "component": component, "indirect_effect": effect}


def test_the_peak_is_the_largest_output_and_a_tie_within_a_thousandth():
    effects = pd.DataFrame([
        rows("x", "mlp", 2, "last", 0.5), rows("x", "attn", 1, "last", 0.3), rows("x", "resid", 0, "subject", 0.9),
        rows("w", "attn", 2, "last", 0.4), rows("w", "mlp", 1, "subject", 0.3995), rows("w", "mlp", 2, "last", 0.1),
        rows("v", "mlp", 1, "subject", 0.2), rows("v", "attn", 2, "last", 0.6), rows("v", "attn", 1, "last", 0.5),
        rows("u", "attn", 1, "last", 0.3015), rows("u", "mlp", 1, "last", 0.3)])
    top = peaks(effects)
    assert list(top.index) == ["x", "w", "v", "u"] and top.index.name == "fact"  # the effects' order, not sorted
    assert top["store"].tolist() == ["mlp", "tie", "attention", "attention"]
    assert top["layer"].tolist() == [2, 2, 2, 1] and top["position"].tolist() == ["last"] * 4
    assert top["indirect_effect"].tolist() == [0.5, 0.4, 0.6, 0.3015]
    alone = peaks(pd.DataFrame([rows("e", "attn", 1, "last", 0.2), rows("e", "attn", 1, "subject", 0.1)]))
    assert alone.loc["e", "store"] == "attention"  # an attention-only model has no MLP to tie with


def test_the_severed_reading_is_the_share_of_the_embedding_s_effect_lost_with_the_mlps_frozen():
    plain, severed = 1.0, {"m": 0.125, "edge_m": 0.25, "b": 0.5, "edge_a": 0.75, "a": 0.875}  # exact in binary
    table = [rows(f, "resid", 0, "subject", plain) for f in severed]
    table += [rows(f, "resid_severed_mlp", 0, "subject", v) for f, v in severed.items()]
    table += [rows("n", "resid", 0, "subject", 0.0005), rows("n", "resid_severed_mlp", 0, "subject", 0.0)]
    table += [rows("m", "resid", 0, "relation", 0.0), rows("m", "resid_severed_mlp", 0, "relation", 0.0)]
    table += [rows("m", "resid", 1, "subject", 0.3), rows("m", "resid_severed_mlp", 1, "subject", 0.3)]
    labels = severed_stores(pd.DataFrame(table))
    assert list(labels.items()) == [("m", "mlp"), ("edge_m", "mlp"), ("b", "both"), ("edge_a", "attention"),
                                    ("a", "attention"), ("n", "none")]  # the effects' order, not sorted
    assert severed_stores(pd.DataFrame(table), band=0.1).to_dict()["edge_m"] == "both"
    on_relation = severed_stores(pd.DataFrame(table), "relation")
    assert on_relation.to_dict() == {"m": "none"}
    no_mlp = severed_stores(pd.DataFrame([rows("x", "resid", 0, "subject", 0.5)]))
    assert no_mlp.to_dict() == {"x": "attention"} and no_mlp.name == "severed_store"


@pytest.fixture(scope="module")
def thm4(tmp_path_factory):
    from models.recall.constructions import main as construct

    out = tmp_path_factory.mktemp("parts") / "mlp"
    assert construct(["--kind", "mlp", "--out", str(out)]) == 0
    return out


def test_the_summary_and_report_are_the_means_of_the_effects_written(thm4, capsys):
    from analyses.causal_tracing import main

    out = thm4.parent / "resampled"
    code, said, _ = run_main(main, [thm4, "--facts", "1:1,2:3", "--draws", "2", "--contexts", "1", "--noise",
                                    "resample", "--corrupt", "relation", "--quiet", "--device", "cpu", "--out", out],
                             capsys)
    assert code == 0
    effects, top = pd.read_csv(out / "effects.csv"), pd.read_csv(out / "peaks.csv")
    assert list(effects.columns) == ["fact", "layer", "position", "component", "indirect_effect",
                                     "clean_probability", "corrupted_probability"]
    assert list(top.columns) == ["fact", "store", "layer", "position", "indirect_effect", "severed_store"]
    assert top["fact"].tolist() == ["1:1", "2:3"] and set(top["severed_store"]) == {"mlp"}
    summary = json.loads((out / "summary.json").read_text())
    per_fact = effects.drop_duplicates("fact")
    assert summary["n_facts"] == 2
    assert summary["clean_probability"] == pytest.approx(per_fact["clean_probability"].mean(), abs=1e-9)
    assert summary["corrupted_probability"] == pytest.approx(per_fact["corrupted_probability"].mean(), abs=1e-9)
    means = effects.groupby(["component", "layer", "position"])["indirect_effect"].mean()
    assert summary["mean_effects"].keys() == {f"{c}/{layer}/{p}" for c, layer, p in means.index}
    assert summary["mean_effects"]["mlp/1/last"] == pytest.approx(means["mlp", 1, "last"], abs=1e-9)
    assert summary["mean_effects"]["resid/0/relation"] > 0.5  # the relation was corrupted
    assert summary["peak_stores"] == {"tie": 2} and summary["severed_stores"] == {"mlp": 2}
    assert summary["settings"] == {"contexts": 1, "draws": 2, "corrupt": "relation", "noise": "resample", "seed": 0,
                                   "facts": [[1, 1], [2, 3]], "device": "cpu"}
    assert summary["storage_rule_agreement"] == {} and summary["known_store_agreement"] == {}
    assert summary["seconds"] > 0 and summary["checkpoint"] == str(thm4)
    lines = said.strip().splitlines()
    assert lines[0] == (f"{thm4}: 2 facts, P(answer) clean {summary['clean_probability']:.3f}, "
                        f"corrupted {summary['corrupted_probability']:.3f}")
    assert lines[1:3] == ["peak of the indirect effect (MLP or attention output): tie 2",
                          "severed (share of the effect through the MLPs): mlp 2"]
    assert lines[3].startswith(f"wrote {out}/ (effects.csv, peaks.csv, summary.json, heat maps) in ")
    assert len(lines) == 4
    maps = {p.name: p.read_bytes() for p in out.glob("heatmap_*.png")}
    assert maps.keys() == {f"heatmap_{c}.png" for c in tracing.COMPONENTS}
    assert len(set(maps.values())) == len(maps)  # each its own component's map


def test_trace_shows_one_step_per_chunk_and_draw_and_reads_the_severed_effect_at_the_corrupted_token(monkeypatch):
    import analyses.causal_tracing as command

    bars = []

    class Bar:
        def __init__(self, **kwargs):
            self.kwargs, self.steps, self.closed = kwargs, 0, False
            bars.append(self)

        def update(self, n):
            self.steps += n

        def close(self):
            self.closed = True

    monkeypatch.setattr(command, "progress_bar", Bar)
    settings = command.TracingSettings(contexts=1, draws=3, corrupt="relation", noise="resample")
    effects, top = command.trace(constructed("mlp"), TASK, settings, facts=FACTS[:2])
    assert bars[0].kwargs == {"total": 3, "desc": "causal tracing", "unit": "draw", "disable": False}
    assert bars[0].steps == 3 and bars[0].closed
    assert top["severed_store"].tolist() == ["mlp", "mlp"]  # read at the relation: the subject was not touched
    assert top["store"].tolist() == ["tie", "tie"] and set(effects["fact"]) == {"0:0", "3:1"}
    assert effects["corrupted_probability"].max() < 0.01  # resampled, as asked: the answer is gone
    command.trace(constructed("mlp"), TASK, settings, facts=FACTS[:1], progress=False)
    assert bars[1].kwargs["disable"] is True and bars[1].kwargs["total"] == 3


def test_trace_s_noise_follows_the_seed():
    from analyses.causal_tracing import TracingSettings, trace

    settings = TracingSettings(contexts=1, draws=1)
    first, _ = trace(constructed("mlp"), TASK, settings, seed=2, facts=FACTS[:2], progress=False)
    again, _ = trace(constructed("mlp"), TASK, settings, seed=2, facts=FACTS[:2], progress=False)
    other, _ = trace(constructed("mlp"), TASK, settings, seed=3, facts=FACTS[:2], progress=False)
    pd.testing.assert_frame_equal(first, again)
    assert not first["corrupted_probability"].equals(other["corrupted_probability"])


def test_the_defaults_are_two_contexts_ten_draws_subject_and_gaussian_noise():
    from analyses.causal_tracing import TracingSettings, parser
    from analyses.sweeps import cli

    args = parser().parse_args(["ckpt"])
    assert cli.settings(args, TracingSettings) == TracingSettings(2, 10, "subject", "gaussian") and args.facts is None
    shown = " ".join(parser().format_help().split())
    for said in ("prompts per fact", "noise draws per prompt", "the token corrupted",
                 "gaussian noise, or resample another token", "trace these facts only, e.g. 3:1,7:0", "S:R,..."):
        assert said in shown


def test_the_heat_map_shows_each_layer_s_mean_effect_by_role():
    from analyses.causal_tracing import heatmap

    effects = pd.DataFrame([rows("a", "mlp", 1, "last", 0.6), rows("b", "mlp", 1, "last", 0.2),
                            rows("a", "mlp", 1, "subject", 0.1), rows("b", "mlp", 1, "subject", 0.3),
                            rows("a", "mlp", 2, "last", 0.5), rows("b", "mlp", 2, "last", 0.5),
                            rows("a", "mlp", 2, "subject", -0.1), rows("b", "mlp", 2, "subject", 0.0),
                            rows("a", "attn", 1, "last", 0.9), rows("b", "attn", 1, "last", 0.9)])
    fig = heatmap(effects, "mlp")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["subject", "last"]  # roles in order
    assert [t.get_text() for t in ax.get_yticklabels()] == ["layer 1", "layer 2"]
    image = ax.get_images()[0]
    assert image.get_array().tolist() == [[0.2, 0.4], [-0.05, 0.5]]
    assert image.get_clim() == (0.0, 0.5) and ax.get_title() == "causal tracing: mlp"  # a negative effect: black
    assert fig.axes[1].get_ylabel() == "indirect effect (probability)"


def test_the_report_names_both_agreements_when_recorded():
    from pathlib import Path

    from analyses.causal_tracing import report

    facts = {"n_facts": 3, "clean_probability": 0.99949, "corrupted_probability": 0.25, "peak_stores": {"mlp": 2,
             "tie": 1}, "severed_stores": {"both": 2, "mlp": 1}, "seconds": 1.25,
             "storage_rule_agreement": {"of": 3, "peak_agrees": 2, "severed_agrees": 0},
             "known_store_agreement": {"of": 3, "peak_component_agrees": 2, "peak_place_agrees": 1,
                                       "severed_agrees": 0}}
    assert report(facts, "ckpt/x", Path("out")).splitlines() == [
        "ckpt/x: 3 facts, P(answer) clean 0.999, corrupted 0.250",
        "peak of the indirect effect (MLP or attention output): mlp 2, tie 1",
        "severed (share of the effect through the MLPs): both 2, mlp 1",
        "against the storage rule (locate_facts): the peak agrees on 2 of 3 facts, the severed reading on 0",
        "against the construction's known stores: the peak names the component on 2 of 3 facts (also the layer "
        "and position on 1), the severed reading on 0",
        "wrote out/ (effects.csv, peaks.csv, summary.json, heat maps) in 1.2 s"]


def test_a_construction_s_known_stores_are_named_by_tracing_s_layer_and_position(tmp_path):
    from analyses.causal_tracing import known_agreement, with_known_stores

    top = pd.DataFrame({"store": ["mlp", "attention", "tie"], "layer": [1, 1, 2],
                        "position": ["subject", "last", "last"], "severed_store": ["mlp", "mlp", "both"]},
                       index=pd.Index(["1:1", "2:3", "0:0"], name="fact"))
    assert with_known_stores(top, tmp_path) is top  # no config.json: nothing known
    (tmp_path / "config.json").write_text(json.dumps({"training": {"steps": 3}}))
    assert with_known_stores(top, tmp_path) is top and known_agreement(top) == {}
    stores = [{"s": 1, "r": 1, "component": "mlp", "layer": 0, "route": "moved by layer 1 heads"},
              {"s": 2, "r": 3, "component": "attention", "layer": 0, "route": "direct"}]
    (tmp_path / "config.json").write_text(json.dumps({"training": {"stores": stores}}))
    known = with_known_stores(top, tmp_path)
    assert known["known"].tolist() == ["mlp", "attention", "none"]
    assert known["known_layer"].tolist()[:2] == [1, 1] and known["known_layer"].isna().tolist()[2]
    assert known["known_position"].tolist()[:2] == ["subject", "last"]
    assert known_agreement(known) == {"of": 3, "known_stores": {"mlp": 1, "attention": 1, "none": 1},
                                      "peak_component_agrees": 2, "peak_place_agrees": 2, "severed_agrees": 1}


def test_the_storage_rule_s_labels_are_read_only_from_results_of_the_same_weights(tmp_path):
    from analyses.causal_tracing import agreement, with_storage_rule

    top = pd.DataFrame({"store": ["mlp", "tie"], "severed_store": ["mlp", "mlp"]},
                       index=pd.Index(["1:1", "2:3"], name="fact"))
    assert with_storage_rule(top, tmp_path, "abc") is top and agreement(top) == {}
    folder = tmp_path / "analysis" / "locate_facts"
    folder.mkdir(parents=True)
    pd.DataFrame({"subject": [2, 5], "relation": [3, 0], "label": ["mlp", "both"]}).to_csv(folder / "facts.csv")
    (folder / "summary.json").write_text(json.dumps({"weights_sha256": "abc"}))
    assert with_storage_rule(top, tmp_path, "abd") is top  # other weights' results
    ruled = with_storage_rule(top, tmp_path, "abc")
    assert ruled["rule"].isna().tolist() == [True, False] and ruled.loc["2:3", "rule"] == "mlp"
    assert agreement(ruled) == {"of": 2, "rule_labels": {"mlp": 1}, "peak_agrees": 0, "severed_agrees": 1}


def test_a_second_run_of_other_settings_into_the_same_folder_is_refused_and_keeps_the_first(thm4, tmp_path, capsys):
    from analyses.causal_tracing import main

    argv = [thm4, "--facts", "1:1", "--draws", "1", "--contexts", "1", "--quiet", "--device", "cpu", "--out",
            tmp_path / "out"]
    assert run_main(main, argv, capsys)[0] == 0
    before = (tmp_path / "out" / "effects.csv").read_bytes()
    code, _, err = run_main(main, [*argv, "--noise", "resample"], capsys)
    assert code == 2 and err.startswith("error:") and len(err.strip().splitlines()) == 1 and "noise" in err
    assert (tmp_path / "out" / "effects.csv").read_bytes() == before
    assert run_main(main, argv, capsys)[0] == 0  # the same settings again: its own results, rewritten


def test_the_resampled_tokens_come_from_the_generator_passed_in():
    model = constructed("mlp")

    def resampled(seed):
        return causal_trace(model, TASK, torch.Generator().manual_seed(seed), 2, 0, FACTS, 1, noise="resample")

    torch.manual_seed(1)
    first = resampled(5)
    torch.manual_seed(2)  # the global generator plays no part
    pd.testing.assert_frame_equal(first, resampled(5))


def test_every_fact_is_traced_by_default_into_a_folder_named_after_the_settings(thm4, capsys):
    from analyses.causal_tracing import main

    code, said, _ = run_main(main, [thm4, "--draws", "1", "--contexts", "1", "--noise", "resample", "--quiet",
                                    "--device", "cpu"], capsys)
    folder = thm4 / "analysis" / "causal_tracing" / "contexts-1_draws-1_noise-resample"
    assert code == 0 and said.startswith(f"{thm4}: 32 facts,") and f"wrote {folder}/ " in said
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["n_facts"] == 32 and "facts" not in summary["settings"] and summary["step"] is None
    assert len(pd.read_csv(folder / "peaks.csv")) == 32


@pytest.mark.parametrize("case, says", [("--step", "no snapshot"),
                                        ("association", "task kind 'association' is not a factual-recall task")])
def test_the_cli_refuses_a_missing_snapshot_and_another_task_kind(thm4, tmp_path, capsys, case, says):
    import shutil

    from analyses.causal_tracing import main

    ckpt = tmp_path / "ckpt"
    shutil.copytree(thm4, ckpt, ignore=shutil.ignore_patterns("analysis"))
    if case == "association":
        config = json.loads((ckpt / "config.json").read_text())
        (ckpt / "config.json").write_text(json.dumps({**config, "task": {**config["task"], "kind": "association"}}))
    code, _, err = run_main(main, [ckpt, *(["--step", "5"] if case == "--step" else []), "--facts", "1:1", "--draws",
                                   "1", "--contexts", "1", "--quiet", "--device", "cpu"], capsys)
    assert code == 2 and err.startswith("error:") and says in err and len(err.strip().splitlines()) == 1
    assert not (ckpt / "analysis").exists()


def test_a_snapshot_is_traced_by_its_step_and_results_of_another_step_are_not_written_over(thm4, tmp_path, capsys):
    import shutil

    from analyses.causal_tracing import main
    from models.checkpoint import snapshot_path

    ckpt = tmp_path / "ckpt"
    shutil.copytree(thm4, ckpt, ignore=shutil.ignore_patterns("analysis"))
    from safetensors.torch import load_file, save_file

    snapshot_path(ckpt, 0).parent.mkdir()  # step 0: every weight zero, P(a*) = 1/|A| on every prompt
    final = load_file(ckpt / "model.safetensors")
    save_file({k: torch.zeros_like(v) for k, v in final.items()}, snapshot_path(ckpt, 0))
    argv = [ckpt, "--facts", "1:1", "--draws", "1", "--contexts", "1", "--quiet", "--device", "cpu", "--out",
            tmp_path / "out"]
    assert run_main(main, [*argv, "--step", "0"], capsys)[0] == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["step"] == 0 and isinstance(summary["seconds"], float) and 0 < summary["seconds"] < 600
    assert summary["clean_probability"] == pytest.approx(1 / TASK.d_vocab_out)  # the snapshot's weights were read
    assert round(summary["seconds"], 2) == summary["seconds"]
    code, _, err = run_main(main, argv, capsys)  # the final weights: other results
    assert code == 2 and "step" in err and "which causal_tracing does not write over" in err


def test_the_cli_shows_progress_unless_quiet(thm4, tmp_path, capsys, monkeypatch):
    import analyses.causal_tracing as command

    shown = []

    class Bar:
        def __init__(self, **kwargs):
            shown.append(not kwargs["disable"])

        def update(self, n):
            pass

        def close(self):
            pass

    monkeypatch.setattr(command, "progress_bar", Bar)
    argv = [thm4, "--facts", "1:1", "--draws", "1", "--contexts", "1", "--device", "cpu"]
    assert run_main(command.main, [*argv, "--out", tmp_path / "a"], capsys)[0] == 0
    assert run_main(command.main, [*argv, "--quiet", "--out", tmp_path / "b"], capsys)[0] == 0
    assert shown == [True, False]


def test_the_help_names_the_command_and_what_it_does():
    from analyses.causal_tracing import parser

    shown = parser().format_help()
    assert shown.startswith("usage: python -m analyses.causal_tracing")
    assert "causal tracing (ROME) of every fact" in shown
    assert "CKPT/analysis/causal_tracing" in shown


@pytest.mark.parametrize("field, value, says", [("corrupt", "object", "corrupt must be subject or relation"),
                                                ("noise", "uniform", "noise must be gaussian or resample")])
def test_the_settings_refuse_a_token_or_noise_they_do_not_know(field, value, says):
    from analyses.causal_tracing import TracingSettings

    with pytest.raises(ValueError, match=says):
        TracingSettings(**{field: value})
