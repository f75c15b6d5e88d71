"""Causal tracing (ROME) on constructions whose storage is known: restoring the clean
embedding undoes the corruption, and the effect sits where the construction keeps the facts."""
import json

import pandas as pd
import pytest
import torch

from models import build_bridge
from models.cli import override
from models.recall.constructions import CONSTRUCTION_MODEL, CONSTRUCTION_TASK, build
from probe.causal_tracing import causal_trace, peaks, severed_stores
from tests.conftest import run_main

TASK = CONSTRUCTION_TASK.build()
FACTS = [(0, 0), (3, 1), (5, 2), (7, 3)]
FLOAT = 1e-5  # probabilities of float32 runs agree to this


def constructed(kind):
    cfg = override(CONSTRUCTION_MODEL, {"attn_only": kind == "attention"})
    return build_bridge(cfg.checkpoint_section(TASK), build(kind, TASK, cfg))


def traced(kind, corrupt="subject", noise="gaussian", seed=0, draws=2):
    model = constructed(kind)
    return causal_trace(model, TASK, torch.Generator().manual_seed(seed), 1, 0, FACTS, draws, corrupt, noise)


def at(effects, component, layer, position):
    rows = effects[(effects["component"] == component) & (effects["layer"] == layer)
                   & (effects["position"] == position)]
    return rows.set_index("fact")["indirect_effect"]


@pytest.mark.parametrize("corrupt, noise", [("subject", "gaussian"), ("relation", "gaussian"),
                                            ("subject", "resample")])
def test_restoring_the_clean_embedding_of_the_corrupted_token_restores_the_clean_probability(corrupt, noise):
    effects = traced("mlp", corrupt, noise)
    per_fact = effects.drop_duplicates("fact").set_index("fact")
    lost = per_fact["clean_probability"] - per_fact["corrupted_probability"]
    assert lost.max() > 0.5  # the corruption hurts (some draws miss a fact: noise the readers do not see)
    restored = at(effects, "resid", 0, corrupt)
    assert (restored - lost).abs().max() < FLOAT
    other = "relation" if corrupt == "subject" else "subject"
    assert at(effects, "resid", 0, other).abs().max() < FLOAT  # a clean token restores nothing
    assert at(effects, "resid", 0, "noise").abs().max() < FLOAT


def test_on_theorem_4_the_mlp_output_at_the_last_position_carries_the_effect():
    effects = traced("mlp", noise="resample")  # another subject: every fact's answer is lost
    per_fact = effects.drop_duplicates("fact").set_index("fact")
    lost = per_fact["clean_probability"] - per_fact["corrupted_probability"]
    assert (lost > 0.5).all()
    assert (at(effects, "mlp", 1, "last") - lost).abs().max() < FLOAT
    assert at(effects, "mlp", 1, "subject").abs().max() < FLOAT
    # severed: with every MLP held at its corrupted value the clean subject restores nothing
    assert at(effects, "resid_severed_mlp", 0, "subject").abs().max() < FLOAT
    assert (severed_stores(effects) == "mlp").all()
    # at one layer the attention output at the last position is the MLP's input: a tie, no peak
    assert (peaks(effects)["store"] == "tie").all()


def test_on_theorem_3_the_attention_output_at_the_last_position_carries_the_effect():
    effects = traced("attention", noise="resample")
    per_fact = effects.drop_duplicates("fact").set_index("fact")
    lost = per_fact["clean_probability"] - per_fact["corrupted_probability"]
    assert (lost > 0.5).all()
    assert (at(effects, "attn", 1, "last") - lost).abs().max() < FLOAT
    assert not effects["component"].isin(["mlp", "resid_severed_mlp"]).any()  # no MLP to restore
    assert at(effects, "resid_severed_attn", 0, "subject").abs().max() < FLOAT
    assert (peaks(effects)["store"] == "attention").all()
    assert (severed_stores(effects) == "attention").all()


def test_the_noise_comes_from_the_generator_passed_in():
    torch.manual_seed(1)
    first = traced("mlp", seed=3)
    torch.manual_seed(2)  # the global generator plays no part
    pd.testing.assert_frame_equal(first, traced("mlp", seed=3))
    assert not first["corrupted_probability"].equals(traced("mlp", seed=4)["corrupted_probability"])


@pytest.fixture(scope="module")
def mlp_ckpt(tmp_path_factory):
    from models.recall.constructions import main as construct

    out = tmp_path_factory.mktemp("tracing") / "mlp"
    assert construct(["--kind", "mlp", "--out", str(out)]) == 0
    return out


def test_the_cli_writes_effects_peaks_summary_and_heat_maps(mlp_ckpt, capsys):
    from analyses.causal_tracing import main

    code, out, _ = run_main(main, [mlp_ckpt, "--facts", "1:1,2:3", "--draws", "2", "--contexts", "1", "--quiet",
                                   "--device", "cpu", "--out", mlp_ckpt.parent / "out"], capsys)
    assert code == 0 and "severed" in out
    folder = mlp_ckpt.parent / "out"
    effects = pd.read_csv(folder / "effects.csv")
    assert list(effects.columns[:5]) == ["fact", "layer", "position", "component", "indirect_effect"]
    assert set(effects["fact"]) == {"1:1", "2:3"}
    assert set(effects["position"]) == {"subject", "relation", "noise", "last"}
    assert set(pd.read_csv(folder / "peaks.csv")["severed_store"]) == {"mlp"}
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["settings"]["draws"] == 2 and summary["weights_sha256"]
    assert (folder / "heatmap_mlp.png").stat().st_size > 0 and (folder / "heatmap_resid_severed_mlp.png").is_file()


@pytest.mark.parametrize("argv, says", [(["--draws", "0"], "--draws must be >= 1"),
                                        (["--contexts", "0"], "--contexts must be >= 1"),
                                        (["--corrupt", "object"], "--corrupt"),
                                        (["--noise", "uniform"], "--noise"),
                                        (["--facts", "8:0"], "outside the task")])
def test_the_cli_refuses_bad_input_in_one_line_and_writes_nothing(mlp_ckpt, tmp_path, capsys, argv, says):
    from analyses.causal_tracing import main

    code, _, err = run_main(main, [mlp_ckpt, *argv, "--quiet", "--out", tmp_path / "out"], capsys)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1 and err.startswith("error:")
    assert not (tmp_path / "out").exists()


def test_the_cli_counts_the_facts_where_tracing_names_the_storage_rule_s_store(mlp_ckpt, capsys):
    """Theorem 4 keeps every fact in the MLP: the severed reading says so, the peak ties."""
    from analyses.causal_tracing import main
    from analyses.locate_facts import main as locate

    assert run_main(locate, [mlp_ckpt, "--quiet", "--device", "cpu"],
                    capsys)[0] == 0
    code, out, _ = run_main(main, [mlp_ckpt, "--facts", "1:1,2:3", "--draws", "2", "--contexts", "1",
                                   "--noise", "resample", "--quiet", "--device", "cpu"], capsys)
    assert code == 0 and "the peak agrees on 0 of 2 facts, the severed reading on 2" in out
    folder = mlp_ckpt / "analysis" / "causal_tracing" / "contexts-1_draws-2_noise-resample" / "facts_1-1_2-3"
    agreed = json.loads((folder / "summary.json").read_text())["storage_rule_agreement"]
    assert agreed == {"of": 2, "rule_labels": {"mlp": 2}, "peak_agrees": 0, "severed_agrees": 2}


def test_at_two_layers_restoring_the_embedding_or_the_last_hidden_state_restores_the_clean_probability():
    """The instrument reads every block through hooks: a two-layer TransformerBridge of random weights."""
    from models.section import InductionSection

    section = InductionSection("generic", 2, 16, 2, 8, 32, "all", None, TASK.seq_len, TASK.d_vocab, TASK.d_vocab_out)
    generator = torch.Generator().manual_seed(0)
    weights = {k: 0.3 * torch.randn(shape, generator=generator)
               for k, shape in section.weight_shapes().items()}
    weights["unembed.W_U"] *= 0.1  # logits of order 1, so P(a*) moves with the subject
    model = build_bridge(section, weights)
    effects = causal_trace(model, TASK, torch.Generator().manual_seed(0), 1, 0, FACTS, 2, noise="resample")
    per_fact = effects.drop_duplicates("fact").set_index("fact")
    lost = per_fact["clean_probability"] - per_fact["corrupted_probability"]
    assert lost.abs().min() > 1e-4 and lost.abs().max() > 1e-3  # another subject moves P(a*) ~ 1/16
    tight = 1e-6  # float32 rounding of probabilities near 1/16 is ~1e-8
    assert sorted(set(effects["layer"])) == [0, 1, 2]
    assert (at(effects, "resid", 0, "subject") - lost).abs().max() < tight
    assert (at(effects, "resid", 2, "last") - lost).abs().max() < tight
    assert at(effects, "resid", 2, "subject").abs().max() < tight  # nothing reads the subject after the last block


def traced_depth(kind):
    """A two-layer construction of known storage (models.recall.deep_constructions), traced."""
    from models.recall.deep_constructions import DEPTH_MODEL, build_depth, plan_for

    model = build_bridge(DEPTH_MODEL.checkpoint_section(TASK), build_depth(TASK, DEPTH_MODEL, plan_for(kind, TASK)))
    return causal_trace(model, TASK, torch.Generator().manual_seed(0), 1, 0, FACTS, 2, noise="resample")


def test_at_two_layers_an_enriched_store_and_its_reader_each_carry_the_whole_effect():
    """(b): block 0's MLP keeps every fact at the subject; block 1's heads move it to the last position.
    Tracing's layer l is block l - 1's output. Another subject loses the answer; restoring the store
    (layer 1's MLP at the subject) or its reader (layer 2's attention at the last position) restores it all."""
    effects = traced_depth("enriched")
    per_fact = effects.drop_duplicates("fact").set_index("fact")
    lost = per_fact["clean_probability"] - per_fact["corrupted_probability"]
    assert (lost > 0.5).all()
    assert (at(effects, "mlp", 1, "subject") - lost).abs().max() < FLOAT
    assert (at(effects, "attn", 2, "last") - lost).abs().max() < FLOAT
    assert at(effects, "mlp", 1, "last").abs().max() < FLOAT  # block 0's MLP never fires at EOS
    assert at(effects, "mlp", 2, "last").abs().max() < FLOAT  # nothing in the last MLP
    top = peaks(effects)  # store and reader tie: the peak cannot name the store alone
    assert (top["store"] == "tie").all() and (severed_stores(effects) == "mlp").all()


def test_at_two_layers_a_last_mlp_store_and_the_heads_that_feed_it_each_carry_the_whole_effect():
    """(a): the last block's MLP keeps every fact, read from the copies block 0's heads gathered at EOS."""
    effects = traced_depth("last-mlp")
    per_fact = effects.drop_duplicates("fact").set_index("fact")
    lost = per_fact["clean_probability"] - per_fact["corrupted_probability"]
    assert (at(effects, "mlp", 2, "last") - lost).abs().max() < FLOAT
    assert (at(effects, "attn", 1, "last") - lost).abs().max() < FLOAT
    assert at(effects, "mlp", 1, "last").abs().max() < FLOAT and at(effects, "mlp", 1, "subject").abs().max() < FLOAT
    assert (peaks(effects)["store"] == "tie").all() and (severed_stores(effects) == "mlp").all()


def test_the_cli_counts_the_facts_where_tracing_names_a_construction_s_known_store(tmp_path, capsys):
    from analyses.causal_tracing import main
    from models.recall.deep_constructions import main as construct

    assert run_main(construct, ["--kind", "enriched", "--n-layers", "2", "--out", str(tmp_path / "b")], capsys)[0] == 0
    code, out, _ = run_main(main, [str(tmp_path / "b"), "--facts", "1:1,2:3", "--draws", "2", "--contexts", "1",
                                   "--noise", "resample", "--quiet", "--device", "cpu"], capsys)
    assert code == 0 and "the peak names the component on 0 of 2 facts" in out
    folder = tmp_path / "b" / "analysis" / "causal_tracing" / "contexts-1_draws-2_noise-resample" / "facts_1-1_2-3"
    known = json.loads((folder / "summary.json").read_text())["known_store_agreement"]
    assert known["known_stores"] == {"mlp": 2} and known["peak_place_agrees"] == 0
