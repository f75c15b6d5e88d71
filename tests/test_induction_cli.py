"""python -m analyses.induction's command line in process: each flag and its stated default reach the
study, the files and summary each command writes under --out, reproduce at a tiny size, refusals in one line."""
import json
import re
from dataclasses import replace

import pandas as pd
import pytest

from analyses.induction import cli, studies
from analyses.induction.cli import main, parser, recipes
from analyses.sweeps.cli import run_cli
from models.induction.config import InductionModelConfig, preset
from tests.conftest import run_main

TINY = ["--steps", "4", "--n-triggers", "2", "--seq-len", "16", "--d-model", "16", "--batch-size", "8",
        "--probe-every", "2", "--device", "cpu", "--quiet"]
SHARED = {"--preset": "sizes (default cpu)", "--steps": "training steps (default: the preset's)",
          "--n-triggers": "K (default: the preset's)", "--seq-len": "T (default: the preset's)",
          "--triggers": "fixed (the K most frequent characters, the authors' fixed_special_toks) or random (drawn "
                        "per sequence from the marginals); default: the preset's (fixed)",
          "--d-model": "d (default: the preset's)", "--batch-size": "sequences per step (default: the preset's)",
          "--lr": "the simplified model's SGD learning rate (default: the preset's; the layers study: AdamW 1e-3)",
          "--seed": "seed of the weights and data (default 0)", "--threads": "torch threads (default torch's)"}
PROBES = {"--probe-every": "probes: steps between snapshots and evaluations (default: the preset's eval_every; "
                           "the authors probe every 5)",
          "--alone": "probes: how the other two memories are held while one trains alone: target (frozen at the "
                     "construction's), init (the authors' freeze_until: frozen at their random init until --until, "
                     "then trained), none (the joint run only); default target",
          "--until": "probes with --alone init: the step the others join training (default 30% of the steps, the "
                     "authors' 300 of 1000)"}


def shown(argv, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        main([*argv, "--help"])
    assert stop.value.code == 0
    return capsys.readouterr().out


def options(text: str) -> dict[str, str]:
    """--flag -> its help text on one line, read from an argparse --help."""
    found = {}
    for block in re.split(r"\n  (?=-)", text.split("options:\n", 1)[1].strip()):
        head, _, rest = block.partition("  ")
        found[head.split()[0].rstrip(",")] = " ".join(rest.split())
    return found


@pytest.mark.parametrize("command, what", [("layers", "one layer against two"),
                                           ("probes", "memory recall probes over training"),
                                           ("reproduce", "every study at a preset's size")])
def test_the_cli_help_states_each_default_the_parser_takes(command, what, capsys):
    text = shown([command], capsys)
    assert text.startswith(f"usage: python -m analyses.induction {command} [-h] [--preset {{cpu,paper}}]")
    assert f"\n\n{what}\n\n" in text and "[--triggers {fixed,random}]" in text
    expected = {**SHARED, **(PROBES if command != "layers" else {}),
                "--out": f"output directory (default induction_{command})", "--quiet": "no progress bars",
                "--device": "auto (CUDA when present) | cpu | cuda | cuda:N", "-h": "show this help message and exit"}
    if command == "layers":
        expected["--lr"] = "the generic models' AdamW learning rate (default 1e-3)"
    assert options(text) == expected
    assert ("[--alone {target,init,none}]" in text) == (command != "layers")
    args = parser().parse_args([command])
    stated = {"preset": "cpu", "steps": None, "n_triggers": None, "seq_len": None, "triggers": None, "d_model": None,
              "batch_size": None, "lr": None, "seed": 0, "out": None, "device": "auto", "threads": None,
              "quiet": False, "command": command}
    if command != "layers":
        stated.update(probe_every=None, alone="target", until=None)
    assert vars(args) == stated


def test_the_cli_help_of_the_checkpoint_commands_and_the_ranks_default(capsys):
    top = shown([], capsys)
    for name, what in (("layers", "one layer against two"), ("probes", "memory recall probes over training"),
                       ("reproduce", "every study at a preset's size"),
                       ("circuit", "the heads by their attention, circuitsvis views"),
                       ("location", "where global and in-context knowledge live")):
        assert re.search(rf"\n    {name} +{re.escape(what)}\n", top), name
    assert "{layers,probes,reproduce,circuit,location}" in top and cli.__doc__.split("\n")[0] in top
    for name, what in (("circuit", "the heads by their attention, circuitsvis views"),
                       ("location", "where global and in-context knowledge live")):
        assert f"\n\n{what}\n\n" in shown([name], capsys)
    location = options(shown(["location"], capsys))
    assert location["--ranks"] == ("ranks the last MLP's output matrix is truncated to, each in 1..min(d_mlp, "
                                   "d_model) (default 1,4,16: those in that range; none without an MLP)")
    assert location["--out"] == "output directory (default CKPT/analysis/induction_location)"
    assert "--ranks" not in options(shown(["circuit"], capsys))
    assert parser().parse_args(["location", "ck"]).ranks is None and cli.DEFAULT_RANKS == (1, 4, 16)
    assert parser().parse_args(["location", "ck", "--ranks", "2,8"]).ranks == (2, 8)


def test_the_cli_recipes_take_each_flag_over_the_preset():
    task0, model0, cfg0 = preset("cpu")
    task, model, cfg, generic, adam = recipes(parser().parse_args(["probes"]))
    assert (task, model) == (task0, model0)
    assert cfg == replace(cfg0, device="auto", snapshot_every=cfg0.eval_every)
    assert generic == InductionModelConfig("generic", 2, 64, 1, 256, True)
    assert adam == replace(cfg0, device="auto", optimizer="adam", lr=(1e-3,), loss="all")
    assert recipes(parser().parse_args(["layers", "--preset", "paper"]))[:2] == preset("paper")[:2]
    flags = ["--steps", "7", "--n-triggers", "2", "--seq-len", "16", "--triggers", "random", "--d-model", "8",
             "--batch-size", "4", "--lr", "0.5", "--seed", "3", "--device", "cpu"]
    task, model, cfg, generic, adam = recipes(parser().parse_args(["probes", *flags]))
    assert task == replace(task0, n_triggers=2, seq_len=16, triggers="random") and model == replace(model0, d_model=8)
    assert cfg == replace(cfg0, seed=(3,), device="cpu", steps=7, batch_size=4, lr=(0.5,), snapshot_every=25)
    assert generic == InductionModelConfig("generic", 2, 8, 1, 32, True)
    assert adam == replace(cfg0, seed=(3,), device="cpu", steps=7, batch_size=4, optimizer="adam", lr=(1e-3,),
                           loss="all")
    layers = recipes(parser().parse_args(["layers", *flags]))  # --lr: the generic models' AdamW learning rate
    assert layers[4] == replace(adam, lr=(0.5,)) and layers[2] == replace(cfg, lr=cfg0.lr)


def recording(monkeypatch, name, returns=None):
    """studies.<name> run as it is (or returning `returns`), its arguments and results kept."""
    asked, real = [], getattr(studies, name)

    def study(*a, **k):
        asked.append((a, k, returns if returns is not None else real(*a, **k)))
        return asked[-1][2]
    monkeypatch.setattr(studies, name, study)
    return asked


CURVES = pd.DataFrame({"layers": [1, 1, 2, 2], "step": [0, 4, 0, 4], "in_context_accuracy": [0.1, 0.25, 0.2, 0.75],
                       "bigram_loss": [3.0, 2.5, 3.1, 2.4]})


def test_the_cli_layers_writes_the_curves_and_the_last_accuracies(tmp_path, monkeypatch, capsys):
    asked = recording(monkeypatch, "one_against_two_layers", returns=(CURVES, {}))
    out = tmp_path / "a" / "b"
    assert main(["layers", *TINY[:10], "--seed", "2", "--device", "cpu", "--out", str(out)]) == 0
    (task, generic, adam, progress), _, _ = asked[0]
    assert (task.n_triggers, task.seq_len, generic.d_model, adam.steps, adam.seed, progress) == (2, 16, 16, 4, (2,),
                                                                                                True)
    pd.testing.assert_frame_equal(pd.read_csv(out / "layers.csv"), CURVES)
    summary = json.loads((out / "summary.json").read_text())
    settings = {"preset": "cpu", "steps": 4, "n_triggers": 2, "seq_len": 16, "triggers": None, "d_model": 16,
                "batch_size": 8, "lr": None, "seed": 2}  # what decides the results: the flags of the sizes
    assert summary == {"preset": "cpu", "seed": 2, "settings": settings, "studies": ["layers"],
                       "layers": {"one_layer": 0.25, "two_layers": 0.75,
                                  "talk": {"one_layer": 0.55, "two_layers": 0.99}, "steps": 4}}
    assert (out / "layers.png").stat().st_size > 1000
    assert capsys.readouterr().out == ("in-context accuracy after 4 steps: one layer 0.250 (talk ~0.55), "
                                       f"two layers 0.750 (talk ~0.99)\nwrote {out}/\n")


def test_the_cli_probes_writes_order_joint_against_alone_and_the_joint_model(tmp_path, monkeypatch, capsys):
    """probes: its tables, figure, joint model and summary under --out; while the study runs, OUT/train_state
    records what it was asked (the summary's run), and the state goes once it is done."""
    asked = recording(monkeypatch, "joint_against_alone")
    real = studies.joint_against_alone
    state_seen = []
    monkeypatch.setattr(studies, "joint_against_alone", lambda *a, **k: state_seen.append(
        json.loads((k["state"] / "run.json").read_text())) or real(*a, **k))
    assert main(["probes", *TINY, "--alone", "init", "--lr", "0.3", "--out", str(tmp_path)]) == 0
    (task, model, cfg, progress), kwargs, found = asked[0]
    assert (cfg.eval_every, cfg.snapshot_every, cfg.lr, progress) == (2, 2, (0.3,), False)
    assert kwargs == {"alone": "init", "until": 2, "state": tmp_path / "train_state"}  # round(0.3 * 4 / 2) * 2
    probes, curves, _ = found
    for name, table in (("probes.csv", probes), ("probes_curves.csv", curves)):
        pd.testing.assert_frame_equal(pd.read_csv(tmp_path / name, keep_default_na=False, na_values=[""]).fillna(
            {"trained_alone": ""}), table, check_dtype=False)
    order = studies.learning_order(probes[probes["mode"] == "joint"])
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "order.csv"), order, check_dtype=False, check_names=False)
    learned = studies.steps_to_learn(probes)
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "joint_alone.csv"), learned, check_dtype=False,
                                  check_names=False)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (set(summary), summary["preset"], summary["seed"]) == ({"preset", "seed", "settings", "studies", "probes"},
                                                                  "cpu", 0)
    summary = summary["probes"]
    assert summary["sizes"] == {"K": 2, "triggers": "fixed", "T": 16, "d": 16, "batch": 8, "lr": 0.3,
                                "momentum": 0.9, "weight_decay": 1e-4, "steps": 4, "probe_every": 2}
    assert summary["order"] == order.probe.tolist() and summary["talk_order"] == ["wo1", "wk1", "wk0"]
    assert summary["first_step"] == {p: None if pd.isna(s) else s for p, s in zip(order.probe, order.first_step)}
    assert summary["alone"] == "init" and summary["until"] == 2
    assert summary["joint_alone"] == json.loads(learned.to_json(orient="records"))
    assert summary["in_context_accuracy_0.9"] == studies.accuracy_to_learn(curves)
    joint = curves[curves["mode"] == "joint"].iloc[-1].drop(["mode", "trained_alone"])
    assert summary["joint_final"] == pytest.approx(joint.to_dict(), nan_ok=True)
    assert summary["run"]["training"]["steps"] == 4 and summary["run"]["model"]["d_model"] == 16
    assert summary["run"]["task"]["n_triggers"] == 2 and state_seen == [summary["run"]]
    model_config = json.loads((tmp_path / "probes_model" / "config.json").read_text())
    assert model_config["training"]["steps_run"] == 4 and model_config["model"]["d_model"] == 16
    assert (tmp_path / "probes_model" / "model.safetensors").is_file() and not (tmp_path / "train_state").exists()
    assert not (tmp_path / "probes_model" / "snapshots").exists() and (tmp_path / "probes.png").stat().st_size > 1000
    out = capsys.readouterr().out
    assert out.startswith("learning order (first step with recall >= 0.9, joint training):\n" +
                          cli.steps_text(order) + "\n")
    assert ("steps to recall >= 0.9, joint against alone (others frozen at their random initial values until "
            f"step 2, then trained):\n{cli.steps_text(learned)}\n") in out
    asked = recording(monkeypatch, "joint_against_alone", returns=found)
    assert main(["probes", *TINY, "--alone", "target", "--until", "3", "--out", str(tmp_path / "t")]) == 0
    assert asked[0][1]["until"] == 3
    summary = json.loads((tmp_path / "t" / "summary.json").read_text())["probes"]
    assert summary["until"] is None and "(others frozen at the construction's memories):" in capsys.readouterr().out


def test_the_cli_reproduce_runs_every_study_at_its_size(tmp_path, monkeypatch, capsys):
    """reproduce: layers, the probes' joint run and a simplified model with a final MLP (4d wide) trained on
    every token, its circuit and location (ranks 1, 4, 16) and its MLP's KL over training."""
    layers = recording(monkeypatch, "one_against_two_layers", returns=(CURVES, {}))
    probes = recording(monkeypatch, "joint_against_alone")
    trained, train = [], cli.train
    monkeypatch.setattr(cli, "train", lambda *a: trained.append(a) or train(*a))
    assert main(["reproduce", *TINY, "--alone", "none", "--out", str(tmp_path)]) == 0
    assert len(layers) == 1 and probes[0][1]["alone"] == "none"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {"preset", "seed", "layers", "probes", "mlp_model", "heads", "location"} <= set(summary)
    assert "joint_alone" not in summary["probes"] and not (tmp_path / "joint_alone.csv").exists()
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert (config["training"]["loss"], config["training"]["steps"], config["model"]["d_mlp"]) == ("all", 4, 64)
    assert summary["layers"]["two_layers"] == 0.75 and layers[0][0][1].d_model == 16
    mlp = summary["mlp_model"]
    assert mlp["source"]["checkpoint"] == str(tmp_path / "model") and len(mlp["ff1_kl_first_last"]) == 2
    curve = pd.read_csv(tmp_path / "mlp_model_curve.csv")
    assert curve.step.tolist() == [0, 4] and mlp["ff1_kl_first_last"] == pytest.approx(
        [curve.ff1_kl.iloc[0], curve.ff1_kl.iloc[-1]])
    last = json.loads((tmp_path / "model" / "metrics.jsonl").read_text().splitlines()[-1])
    assert mlp["final"] == {k: v for k, v in last.items() if isinstance(v, float)} and trained[0][3] is False
    location = pd.read_csv(tmp_path / "location.csv")
    assert location.variant.tolist()[:5] == ["clean", "mlp_ablated", "mlp_rank_1", "mlp_rank_4", "mlp_rank_16"]
    assert [row["variant"] for row in summary["location"]] == location.variant.tolist()
    assert pd.DataFrame(summary["location"]).drop(columns="variant").to_numpy() == pytest.approx(
        location.drop(columns="variant").to_numpy())
    assert isinstance(summary["ff1_kl"], float) and len(summary["heads"]) == 2
    for name in ("layers.csv", "probes.csv", "order.csv", "circuit.html", "heads.csv", "location.png"):
        assert (tmp_path / name).is_file(), name
    title = "<title>The induction circuit of the simplified model with a final MLP</title>"
    assert title in (tmp_path / "circuit.html").read_text() and (tmp_path / "probes_model" / "config.json").is_file()


def test_an_interrupted_reproduce_keeps_its_finished_studies_and_runs_the_rest(tmp_path, monkeypatch, capsys):
    """summary.json is written after each study; a reproduce of the same settings into that folder keeps
    the studies it names and runs the others, one of other settings runs every study again."""
    layers = recording(monkeypatch, "one_against_two_layers", returns=(CURVES, {}))
    probes = recording(monkeypatch, "joint_against_alone")

    def cut(args, out):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "reproduce_location", cut)
    argv = ["reproduce", *TINY, "--alone", "none", "--out", str(tmp_path)]
    with pytest.raises(KeyboardInterrupt):
        main(argv)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["studies"] == ["layers", "probes"] and summary["layers"]["two_layers"] == 0.75
    assert summary["settings"] == {"preset": "cpu", "steps": 4, "n_triggers": 2, "seq_len": 16, "triggers": None,
                                   "d_model": 16, "batch_size": 8, "lr": None, "seed": 0, "probe_every": 2,
                                   "alone": "none", "until": None}
    monkeypatch.setattr(cli, "reproduce_location", lambda args, out: {"mlp_model": {"steps": args.steps}})
    capsys.readouterr()
    assert main(argv) == 0
    assert (len(layers), len(probes)) == (1, 1)  # kept, not trained again
    printed = capsys.readouterr().out
    assert f"layers: kept, finished by an earlier run of these settings ({tmp_path}/summary.json)" in printed
    assert "probes: kept" in printed and "in-context accuracy" not in printed
    again = json.loads((tmp_path / "summary.json").read_text())
    assert again["studies"] == ["layers", "probes", "mlp_model"] and again["mlp_model"] == {"steps": 4}
    assert {k: again[k] for k in summary if k != "studies"} == {k: v for k, v in summary.items() if k != "studies"}
    assert main([*argv, "--seed", "1"]) == 0  # other settings: every study again
    assert (len(layers), len(probes)) == (2, 2)
    assert "summary.json: written at other settings; every study runs again" in capsys.readouterr().out
    assert json.loads((tmp_path / "summary.json").read_text())["settings"]["seed"] == 1


def test_the_cli_writes_to_the_default_out_and_sets_the_threads(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    threads = []
    monkeypatch.setattr(cli.torch, "set_num_threads", threads.append)
    recording(monkeypatch, "one_against_two_layers", returns=(CURVES, {}))
    assert main(["layers", *TINY[:10], "--device", "cpu", "--quiet", "--threads", "1"]) == 0
    assert threads == [1] and (tmp_path / "induction_layers" / "summary.json").is_file()
    assert capsys.readouterr().out.endswith("wrote induction_layers/\n")


@pytest.mark.parametrize("flag", ["--steps", "--n-triggers", "--seq-len", "--d-model", "--batch-size",
                                  "--probe-every"])
def test_the_cli_refuses_a_size_below_one_in_one_line(flag, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        run_cli(lambda: main(["probes", *TINY, flag, "0", "--out", str(tmp_path / "o")]))  # tiny if not refused
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err == f"error: {flag} must be >= 1, got 0.\n" and not (tmp_path / "o").exists()


def test_the_cli_takes_sizes_of_one(tmp_path, monkeypatch):
    asked = []
    monkeypatch.setattr(cli, "run_probes", lambda args, out: asked.append(args) or {})
    sizes = ["--steps", "1", "--n-triggers", "1", "--seq-len", "2", "--d-model", "1", "--batch-size", "1",
             "--probe-every", "1"]  # T >= 2: the task's own rule, checked (with the memory) before --out is made
    assert main(["probes", *sizes, "--out", str(tmp_path)]) == 0
    assert [getattr(asked[0], k) for k in ("steps", "n_triggers", "seq_len", "d_model", "batch_size",
                                           "probe_every")] == [1, 1, 2, 1, 1, 1]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from models.induction.config import InductionTaskConfig, InductionTrainConfig
    from models.induction.trainer import train

    cfg = InductionTrainConfig(lr=(0.2,), batch_size=8, steps=4, eval_every=2, eval_size=8, snapshot_every=2,
                               device="cpu", loss="all")
    result = train(InductionTaskConfig(n_triggers=2, seq_len=16), InductionModelConfig(d_model=16, d_mlp=32), cfg,
                   progress=False)[0]
    return result.save(tmp_path_factory.mktemp("induction") / "model")


def test_the_cli_circuit_and_location_of_a_snapshot_print_and_record_their_tables(ckpt, tmp_path, capsys):
    """--step N reads that snapshot: the tables printed (3 decimals) are those written and in summary.json,
    with the MLP's KL; the page is titled with the checkpoint and step; a folder of other results refused."""
    from models import load
    from models.checkpoint import weights_sha256
    from probe.induction import knowledge_location, memory_recall

    model, task = load(ckpt, "cpu", 2, kind="induction")
    out = tmp_path / "loc"
    assert main(["location", str(ckpt), "--step", "2", "--ranks", "2", "--device", "cpu", "--out", str(out)]) == 0
    table = knowledge_location(model, task, ranks=(2,))
    assert capsys.readouterr().out == table.to_string(float_format="%.3f") + f"\nwrote {out}/\n"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step"] == 2 and summary["settings"] == {"ranks": [2]}
    assert pd.DataFrame(summary["location"]).set_index("variant").to_numpy() == pytest.approx(table.to_numpy())
    recall = memory_recall(model, task).set_index("probe").value
    assert summary["ff1_kl"] == pytest.approx(float(recall["ff1"]))
    assert main(["circuit", str(ckpt), "--step", "2", "--device", "cpu", "--out", str(tmp_path / "c")]) == 0
    heads = pd.read_csv(tmp_path / "c" / "heads.csv")
    assert capsys.readouterr().out == heads.to_string(index=False, float_format="%.3f") + f"\nwrote {tmp_path}/c/\n"
    recorded = pd.DataFrame(json.loads((tmp_path / "c" / "summary.json").read_text())["heads"])
    assert list(recorded) == list(heads) and recorded.to_numpy() == pytest.approx(heads.to_numpy())
    assert f"The induction circuit of {ckpt} at step 2<" in (tmp_path / "c" / "circuit.html").read_text()
    assert main(["circuit", str(ckpt), "--device", "cpu", "--quiet", "--out", str(tmp_path / "f")]) == 0
    assert f"The induction circuit of {ckpt}<" in (tmp_path / "f" / "circuit.html").read_text()
    with pytest.raises(SystemExit) as stop:
        run_cli(lambda: main(["location", str(ckpt), "--ranks", "2", "--device", "cpu", "--out", str(out)]))
    assert stop.value.code == 2 and capsys.readouterr().err == (
        f"error: {out} holds other induction_location results (step: recorded 2, now null; weights_sha256: recorded "
        f'"{weights_sha256(ckpt, 2)[:12]}...", now "{weights_sha256(ckpt)[:12]}..."), which the induction location '
        "analysis does not write over; move them, or choose another --out.\n")
    with pytest.raises(SystemExit) as stop:
        run_cli(lambda: main(["layers", "--out", str(ckpt / "analysis" / "x")]))
    assert stop.value.code == 2 and capsys.readouterr().err == (
        f"error: --out {ckpt / 'analysis' / 'x'} is inside a checkpoint ({ckpt}), whose results it would pass "
        "for; choose a folder outside it.\n")


@pytest.mark.parametrize("argv, message", [
    ([], "error: the following arguments are required: command"),
    (["probes", "--triggers", "bogus"], "error: argument --triggers: invalid choice: 'bogus' (choose from 'fixed', "
                                        "'random')"),
    (["probes", "--alone", "bogus"], "error: argument --alone: invalid choice: 'bogus' (choose from 'target', "
                                        "'init', 'none')"),
    (["layers", "--alone", "init"], "error: unrecognized arguments: --alone init"),
    (["location", "ck", "--ranks", "a"], "error: argument --ranks: expected a comma-separated list of int, got the "
                                         "item 'a'"),
])
def test_the_cli_refuses_a_missing_command_and_unknown_choices_in_one_line(argv, message, tmp_path, capsys):
    tiny = [*TINY[:10], "--device", "cpu", "--quiet", "--out", str(tmp_path)] if argv[:1] == ["probes"] else []
    with pytest.raises(SystemExit) as stop:
        run_cli(lambda: main([*argv, *tiny]))  # tiny sizes: a choice not refused trains briefly
    assert stop.value.code == 2 and capsys.readouterr().err == message + "\n"


def run(argv, capsys) -> tuple[int, str, str]:
    """The command in this process as `python -m analyses.induction` runs it: (exit code, stdout, stderr)."""
    return run_main(main, argv, capsys)


@pytest.fixture(scope="module")
def no_mlp(tmp_path_factory):
    """A simplified model without an MLP, trained without snapshots."""
    from models.induction.config import InductionTaskConfig, InductionTrainConfig
    from models.induction.trainer import train

    cfg = InductionTrainConfig(lr=(0.2,), batch_size=8, steps=2, eval_every=2, eval_size=8, device="cpu")
    result = train(InductionTaskConfig(n_triggers=2, seq_len=16), InductionModelConfig(d_model=16), cfg,
                   progress=False)[0]
    return result.save(tmp_path_factory.mktemp("induction") / "no_mlp")


@pytest.mark.parametrize("ranks", ["-2", "0", "17", "1000", "2,17"])
def test_location_refuses_a_rank_the_mlps_output_matrix_does_not_have(ranks, ckpt, tmp_path, capsys):
    """The MLP is 32 wide on d = 16: W_out [32, 16] has rank at most 16; nothing is written."""
    out = tmp_path / "loc"
    code, _, err = run(["location", str(ckpt), f"--ranks={ranks}", "--device", "cpu", "--out", str(out)], capsys)
    wrong = [r for r in ranks.split(",") if not 1 <= int(r) <= 16][0]
    assert (code, err) == (2, f"error: --ranks must each be in 1..16 (the last MLP's W_out is 32 x 16), got "
                              f"{wrong}.\n")
    assert not out.exists()


def test_location_takes_the_ranks_the_mlp_has_and_none_without_an_mlp(ckpt, no_mlp, tmp_path, capsys):
    """--ranks 16 (the most) is taken; a model without an MLP refuses --ranks and records none by default."""
    assert main(["location", str(ckpt), "--ranks", "1,16", "--device", "cpu", "--quiet", "--out",
                 str(tmp_path / "a")]) == 0
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["settings"] == {"ranks": [1, 16]}
    code, _, err = run(["location", str(no_mlp), "--ranks", "2", "--device", "cpu", "--out", str(tmp_path / "b")],
                       capsys)
    assert (code, err) == (2, f"error: --ranks: {no_mlp} has no MLP to truncate; leave --ranks out.\n")
    assert not (tmp_path / "b").exists()
    assert main(["location", str(no_mlp), "--device", "cpu", "--quiet", "--out", str(tmp_path / "c")]) == 0
    summary = json.loads((tmp_path / "c" / "summary.json").read_text())
    assert summary["settings"] == {"ranks": []}
    assert not [v for v in pd.DataFrame(summary["location"]).variant if v.startswith("mlp")]
    assert cli.default_ranks(8) == (1, 4) and cli.default_ranks(0) == ()


def test_a_step_without_a_snapshot_names_this_familys_flag(no_mlp, tmp_path, capsys):
    code, _, err = run(["circuit", str(no_mlp), "--step", "50", "--device", "cpu", "--out", str(tmp_path)], capsys)
    assert code == 2 and err.endswith("it has no snapshots (train with --snapshot-every N to write them).\n"), err


def test_a_checkpoint_of_another_task_is_refused_with_its_article(tmp_path, capsys):
    code, _, err = run(["location", "tests/data/pre_aot_package/factual_recall", "--out", str(tmp_path)], capsys)
    assert code == 2 and "task kind 'factual_recall' is not an induction task; " in err, err


@pytest.mark.parametrize("argv, message", [
    (["layers", "--lr", "-1"], "error: --lr must be > 0, got -1.0.\n"),
    (["layers", "--lr", "0"], "error: --lr must be > 0, got 0.0.\n"),
    (["probes", "--threads", "0"], "error: --threads must be > 0, got 0.\n"),
    (["reproduce", "--threads", "-2"], "error: --threads must be > 0, got -2.\n"),
])
def test_the_cli_refuses_a_learning_rate_or_threads_not_above_zero(argv, message, tmp_path, capsys):
    code, _, err = run([*argv, *TINY[:10], "--device", "cpu", "--quiet", "--out", str(tmp_path / "o")], capsys)
    assert (code, err) == (2, message) and not (tmp_path / "o").exists()


def test_the_layers_study_trains_at_the_given_learning_rate(tmp_path, monkeypatch):
    asked = recording(monkeypatch, "one_against_two_layers", returns=(CURVES, {}))
    assert main(["layers", *TINY[:10], "--lr", "0.01", "--device", "cpu", "--out", str(tmp_path)]) == 0
    adam = asked[0][0][2]
    assert (adam.optimizer, adam.lr) == ("adam", (0.01,))
    assert json.loads((tmp_path / "summary.json").read_text())["settings"]["lr"] == 0.01


@pytest.mark.parametrize("command", ["layers", "probes", "reproduce"])
def test_a_study_that_cannot_fit_in_memory_is_refused_before_out_is_made(command, tmp_path, capsys):
    """d = 100000: the generic models' weights (layers) or the simplified model's W_K, W_Q (probes) need
    hundreds of GiB; one line says how much, and nothing is written."""
    code, _, err = run([command, "--d-model", "100000", "--device", "cpu", "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and re.fullmatch(r"error: this run needs an estimated \d+\.\d GiB of memory on cpu \(weights "
                                      r"\d+\.\d GiB\), more than the \d+\.\d GiB available; make it smaller "
                                      r"\(--d-model, --d-mlp, or fewer --lr/--seed values\)\.\n", err), err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command, says", [
    ("probes", "interrupted in the probes study; the same command continues: the joint run goes on from its last "
               "evaluation (its state in {out}/train_state), the runs of one memory alone train again"),
    ("layers", "interrupted in the layers study; the same command continues: the layers study trains again from "
               "its start"),
    ("reproduce", "interrupted in the layers study; the same command continues (the studies finished before it are "
                  "kept): the layers study trains again from its start")])
def test_an_interrupted_study_says_what_a_rerun_does(command, says, tmp_path, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    for name in ("joint_against_alone", "one_against_two_layers"):
        monkeypatch.setattr(studies, name, interrupted)
    code, _, err = run([command, *TINY[:10], "--device", "cpu", "--quiet", "--out", str(tmp_path)], capsys)
    assert (code, err) == (130, says.format(out=tmp_path) + "\n")


def test_the_first_steps_print_as_whole_numbers_or_never():
    table = pd.DataFrame({"probe": ["wk0", "wk1"], "memory": ["a", "b"], "first_step": [40.0, float("nan")]})
    assert cli.steps_text(table).splitlines() == ["probe memory first_step", "  wk0      a         40",
                                                  "  wk1      b      never"]
    learned = pd.DataFrame({"probe": ["wo1"], "joint": [5.0], "alone": [float("nan")]})
    assert cli.steps_text(learned).splitlines()[1].split() == ["wo1", "5", "never"]
