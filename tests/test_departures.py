"""Each of the authors' departures from the standard model, taken alone, changes what it says
and nothing else: the one-at-a-time study rests on it."""
import json
import math

import pandas as pd
import pytest
import torch

from models.bridge import build_bridge
from models.recall import parameterisation as param
from models.recall.config import ModelConfig, TaskConfig
from models.recall.weights import init_weights, trainable_keys
from models.section import ATTN, MLP, ModelSection

TASK = TaskConfig(n_subjects=8, n_relations=8, answers_per_relation=4, n_noise=16, seq_len=8).build()
SIZES = dict(d_model=32, n_heads=4, d_head=4, d_mlp=48)  # d / d_h = 8, H d_h / d = 1/2
QKV = [ATTN + k for k in ("W_Q", "W_K", "W_V")]


def weights(parameterisation: str, seed: int = 0) -> dict:
    return init_weights(ModelConfig(parameterisation=parameterisation, **SIZES), TASK, seed)


def differing(a: dict, b: dict) -> set[str]:
    return {k for k in a if not torch.equal(a[k], b[k])}


def test_the_forms_name_the_departures():
    assert param.departures("standard") == frozenset()
    assert param.departures("authors") == frozenset(param.DEPARTURES)
    assert param.departures("standard+qkv_init+o_init") == {"qkv_init", "o_init"}
    assert param.departures("authors-residual-embedding") == set(param.DEPARTURES) - {"residual", "embedding"}
    assert len(param.variants()) == 2 + 2 * len(param.DEPARTURES)
    assert {v for v in param.variants() if param.departures(v) in (frozenset(), frozenset(param.DEPARTURES))} == \
        {"standard", "authors"}


@pytest.mark.parametrize("text, problem", [("standard+foo", "unknown departure 'foo'"),
                                           ("authors-o_init-o_init", "a departure named twice"),
                                           ("authors+residual", "unknown parameterisation"),
                                           ("standard+", "unknown departure ''"),
                                           ("Standard", "unknown parameterisation")])
def test_a_malformed_parameterisation_is_refused_in_one_line(text, problem):
    with pytest.raises(ValueError, match=problem) as err:
        ModelConfig(parameterisation=text).validate()
    assert "\n" not in str(err.value)


def test_the_scale_departures_rescale_the_same_draws():
    """Adding qkv_init or o_init to the standard model rescales its matrices by the ratio of
    the fan-ins and leaves every other weight as it was."""
    d, H, dh = SIZES["d_model"], SIZES["n_heads"], SIZES["d_head"]
    standard = weights("standard")
    qkv = weights("standard+qkv_init")
    assert differing(standard, qkv) == set(QKV)
    for key in QKV:
        torch.testing.assert_close(qkv[key], standard[key] * math.sqrt(d / dh))
    o = weights("standard+o_init")
    assert differing(standard, o) == {ATTN + "W_O"}
    torch.testing.assert_close(o[ATTN + "W_O"], standard[ATTN + "W_O"] * math.sqrt(H * dh / d))


def test_the_authors_model_less_a_scale_departure_takes_the_standard_scale():
    d, dh = SIZES["d_model"], SIZES["d_head"]
    authors = weights("authors")
    less = weights("authors-qkv_init")
    assert differing(authors, less) == set(QKV)
    for key in QKV:
        torch.testing.assert_close(less[key], authors[key] * math.sqrt(dh / d))


def test_the_embedding_departure_rescales_the_sphere_draws_only():
    """Gaussian and unit-norm embeddings are the same draws, scaled per token; no other weight moves."""
    standard, gaussian = weights("standard"), weights("standard+embedding")
    assert differing(standard, gaussian) == {"embed.W_E", "unembed.W_U"}
    ratio = gaussian["embed.W_E"] / standard["embed.W_E"]  # [V, d]: one factor per token
    torch.testing.assert_close(ratio, ratio[:, :1].expand_as(ratio))
    assert ModelConfig(parameterisation="standard+embedding").resolved().embedding == "gaussian"
    assert ModelConfig(parameterisation="authors-embedding").resolved().embedding == "sphere"


def test_the_mlp_init_departure_truncates_the_mlp_draws_at_two_deviations():
    standard, truncated = weights("standard"), weights("standard+mlp_init")
    assert differing(standard, truncated) == {MLP + "W_in", MLP + "W_out"}
    for key, fan_in in ((MLP + "W_in", SIZES["d_model"]), (MLP + "W_out", SIZES["d_mlp"])):
        std = 1 / math.sqrt(fan_in) / 0.87962566103423978
        assert truncated[key].abs().max() <= 2 * std
        assert standard[key].abs().max() > 2 * std  # the untruncated draws pass it somewhere
        assert truncated[key].std().item() == pytest.approx(1 / math.sqrt(fan_in), rel=0.1)


def test_the_residual_departure_makes_the_last_residual_the_attention_output():
    """Only b_O changes, and through the TransformerLens model's hooks the last position's
    residual after attention is exactly the attention output (EOS embedding cancelled)."""
    standard, residual = weights("standard"), weights("standard+residual")
    assert differing(standard, residual) == {ATTN + "b_O"}
    cfg = ModelConfig(parameterisation="standard+residual", **SIZES)
    bridge = build_bridge(cfg.checkpoint_section(TASK), residual)
    tokens = TASK.sample(16, torch.Generator().manual_seed(1)).tokens
    _, cache = bridge.run_with_cache(tokens)
    mid = cache["blocks.0.hook_resid_mid"][:, -1]  # [batch, d]
    attn = cache["blocks.0.hook_attn_out"][:, -1] - residual[ATTN + "b_O"]  # the heads' output, bias apart
    torch.testing.assert_close(mid, attn, atol=1e-6, rtol=0)


def test_only_the_mlp_bias_departure_trains_b_in():
    for variant in param.variants():
        cfg = ModelConfig(parameterisation=variant, **SIZES)
        trains_bias = MLP + "b_in" in trainable_keys(weights(variant), cfg)
        assert trains_bias == ("mlp_bias" in param.departures(variant)), variant
    assert differing(weights("standard"), weights("standard+mlp_bias")) == set()


def test_a_variant_is_recorded_and_read_back_from_config_json():
    cfg = ModelConfig(parameterisation="authors-residual", **SIZES)
    assert cfg.recorded()["parameterisation"] == "authors-residual"
    section = cfg.checkpoint_section(TASK)
    assert ModelSection.from_json(section.to_json()).parameterisation == "authors-residual"
    assert "parameterisation" not in ModelConfig(**SIZES).checkpoint_section(TASK).to_json()


# ------------------------------------------------------------------ the one-at-a-time study
def test_the_standard_models_mlp_starts_half_dead_and_the_residual_departure_revives_it():
    """At (1, 1, 8), d = 32 the EOS embedding dominates the standard model's MLP input: a large
    share of units is off on every prompt or on for every prompt. Reading the attention output
    alone (the residual departure) leaves almost none stuck, and none in the authors' model."""
    from analyses.capacity.departures import initial_state
    from models.recall.config import shape_model

    task = TaskConfig(n_subjects=24, n_relations=24, answers_per_relation=8, n_noise=48, seq_len=32).build()
    tokens = task.sample(512, torch.Generator().manual_seed(0)).tokens
    state = {}
    for variant in ("standard", "standard+residual", "standard+qkv_init", "authors", "authors-residual"):
        cfg = shape_model(1, 1, 8, 32, variant).resolved()
        bridge = build_bridge(cfg.checkpoint_section(task), init_weights(cfg, task, 0))
        state[variant] = initial_state(bridge, tokens)
    stuck = {v: s["dead_units"] + s["always_on_units"] for v, s in state.items()}  # units that never switch
    assert stuck["standard"] > 0.3
    assert stuck["standard+residual"] < 0.05 and stuck["authors"] == 0
    assert stuck["standard+qkv_init"] < stuck["standard"]  # larger values: the heads' output weighs more
    assert stuck["authors-residual"] > stuck["authors"]
    # the residual after attention loses the EOS embedding: its norm falls from ~1 to the heads' output
    assert state["standard+residual"]["mlp_input_norm"] < 0.5 * state["standard"]["mlp_input_norm"]
    # Q and K entries N(0, 1/d_h) instead of N(0, 1/d), the same draws: scores exactly d / d_h = 8 times wider
    assert state["standard+qkv_init"]["score_std"] == pytest.approx(8 * state["standard"]["score_std"], rel=1e-4)
    assert state["authors"]["score_std"] > 4 * state["standard"]["score_std"]


def test_the_verdicts_name_the_departures_that_flip_a_size():
    from analyses.capacity.departures import verdicts

    table = pd.DataFrame({"variant": ["standard", "standard+qkv_init", "standard+o_init", "authors",
                                      "authors-residual", "authors-qkv_init", "standard"],
                          "S": [30] * 6 + [20], "stored": [False, True, False, True, True, False, True]})
    out = verdicts(table)
    assert out[30] == {"standard_stores": False, "authors_stores": True, "added_to_standard_flips": ["qkv_init"],
                       "removed_from_authors_flips": ["qkv_init"]}
    assert out[20]["standard_stores"] and out[20]["authors_stores"] is None
    assert out[20]["removed_from_authors_flips"] is None and out[20]["added_to_standard_flips"] == []


def test_the_study_trains_each_variant_once_and_resumes(tmp_path, capsys):
    from tests.test_capacity_memory import _cli

    argv = ["departures", "--shape", "1,1,2", "--d", "8", "--sizes", "3,4", "--variants",
            "standard,standard+residual,authors", "--answers", "2", "--seq-len", "4", "--lr", "0.03",
            "--steps", "40", "--batch-size", "32", "--eval-every", "20", "--eval-size", "32", "--prompts", "32",
            "--device", "cpu", "--quiet", "--out", str(tmp_path)]
    code, out, _ = _cli(argv, capsys)
    assert code == 0 and "(6 new training runs)" in out
    table = pd.read_csv(tmp_path / "departures.csv")
    assert sorted(zip(table["variant"], table["S"])) == sorted(
        (v, S) for v in ("standard", "standard+residual", "authors") for S in (3, 4))
    assert table.set_index("variant").loc["standard+residual", "departures"].tolist() == ["residual"] * 2
    assert (table["stored"] == (table["best_accuracy"] >= 0.99)).all()
    assert table["steps_to_target"].isna().tolist() == (~table["stored"]).tolist()
    assert (tmp_path / "departures.png").exists()
    settings = json.loads((tmp_path / "settings.json").read_text())
    assert settings["analysis"] == "capacity departures" and settings["shape"] == [1, 1, 2] and settings["d"] == 8
    code, out, _ = _cli(argv, capsys)
    assert code == 0 and "(0 new training runs)" in out


@pytest.mark.parametrize("flags, problem", [(["--variants", "standard+foo"], "unknown departure 'foo'"),
                                            (["--variants", "authors,authors"], "authors given twice"),
                                            (["--shape", "1,1"], "--shape must be ALPHA,BETA,H")])
def test_the_study_refuses_bad_input_in_one_line(tmp_path, capsys, flags, problem):
    from tests.test_capacity_memory import _cli

    code, _, err = _cli(["departures", *flags, "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and problem in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()
