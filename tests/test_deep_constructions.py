"""The L-layer constructions of known storage (models.recall.deep_constructions): exact (accuracy
1.0), and each fact kept where its plan says: removing its store (and only its store) loses it; the
command's record, help and refusals."""
from dataclasses import replace

import pytest
import torch

from models.bridge import build_bridge, load
from models.checkpoint import load_checkpoint
from models.cores.forward import last_position_logits
from models.out_folder import FORCE_HELP
from models.recall import deep_constructions
from models.recall.config import ModelConfig
from models.recall.constructions import ANSWER_LOGIT, CONSTRUCTION_TASK
from models.recall.deep_constructions import DEPTH_STORES, build_depth, plan_for, storage_of, where_stored
from models.recall.weights import stack
from tasks.factual_recall import FactualRecallTask
from tests.conftest import run_main

TASK = FactualRecallTask(6, 3, 3, 8, 8)  # V = 18, O = 9: d >= 18 + 2 * 9 + 6 + 3 = 45
PLANS = {
    "(a) last MLP": lambda s, r: "mlp",
    "(b) enriched": lambda s, r: "enriched",
    "(c) mixed": lambda s, r: ("attention", "mlp", "enriched", "none")[(s + 2 * r) % 4],
}


def model(n_layers: int) -> ModelConfig:
    return ModelConfig(d_model=48, n_heads=3, d_head=4, d_mlp=18, n_layers=n_layers)


def plan_of(name: str) -> list[list[str]]:
    return [[PLANS[name](s, r) for r in range(TASK.n_relations)] for s in range(TASK.n_subjects)]


def margins(w: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Per fact [S, R], over its prompts: whether every one is answered right, and the smallest
    margin of a* over the mean logit of the other answers of A_r (what a relation writes onto all
    of A_r cancels)."""
    batch = TASK.eval_set(4096, 7)
    logits = last_position_logits(stack([w]), batch.tokens[None])[0]  # [B, O]
    right = (logits.argmax(-1) == batch.answers).float()
    D = TASK.answers_per_relation
    block = logits.view(-1, TASK.n_relations, D)[torch.arange(len(batch)), batch.relations]  # [B, D]
    own = logits.gather(-1, batch.answers[:, None])[:, 0]
    margin = own - (block.sum(-1) - own) / (D - 1)
    known, smallest = torch.ones(TASK.n_subjects, TASK.n_relations), torch.zeros(TASK.n_subjects, TASK.n_relations)
    for s in range(TASK.n_subjects):
        for r in range(TASK.n_relations):
            mine = (batch.subjects == s) & (batch.relations == r)
            assert mine.sum() >= 24
            known[s, r], smallest[s, r] = right[mine].min(), margin[mine].min()
    return known, smallest


def without(w: dict, keys: list[str]) -> dict:
    return {k: torch.zeros_like(t) if k in keys else t for k, t in w.items()}


@pytest.mark.parametrize("n_layers", [2, 3, 4])
@pytest.mark.parametrize("name", PLANS)
def test_each_depth_construction_is_exact_and_keeps_each_fact_where_its_plan_says(name, n_layers):
    """Accuracy 1.0 on every stored fact in every context (0 on the `none` ones), and removing a store
    takes from each fact's margin exactly its logit where the plan keeps the fact there, else nothing."""
    plan = plan_of(name)
    w = build_depth(TASK, model(n_layers), plan)
    stored = torch.tensor([[plan[s][r] != "none" for r in range(TASK.n_relations)]
                           for s in range(TASK.n_subjects)]).float()
    known, before = margins(w)
    assert torch.equal(known, stored)
    last = n_layers - 1
    removed = {("attention", "mlp"): ["blocks.0.attn.W_O"],  # block 0's heads: answers, and the copies (a) reads
               ("mlp",): [f"blocks.{last}.mlp.W_out"], ("enriched",): ["blocks.0.mlp.W_out"],
               ("enriched", ""): ["blocks.1.attn.W_O"]}  # the heads that move the enrichment
    for needs, keys in removed.items():
        _, after = margins(without(w, keys))
        for s in range(TASK.n_subjects):
            for r in range(TASK.n_relations):
                if plan[s][r] == "none":
                    continue
                expected = ANSWER_LOGIT if plan[s][r] in needs else 0.0
                assert abs((before[s, r] - after[s, r]).item() - expected) < 1e-3, (keys, s, r, plan[s][r])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_depth_construction_is_exact_whatever_the_seed_of_its_embeddings(seed):
    plan = plan_of("(c) mixed")
    known, _ = margins(build_depth(TASK, model(2), plan, seed=seed))
    assert torch.equal(known, torch.tensor([[float(x != "none") for x in row] for row in plan]))


def test_a_depth_construction_is_the_transformer_bridge_s_model():
    w = build_depth(TASK, model(3), plan_of("(c) mixed"))
    tokens = TASK.eval_set(256, 3).tokens
    bridge = build_bridge(model(3).checkpoint_section(TASK), w)
    with torch.no_grad():
        reference = bridge(tokens)[:, -1]
    assert (reference - last_position_logits(stack([w]), tokens[None])[0]).abs().max() <= 3e-5 * reference.abs().max()


def test_the_storage_table_names_layer_component_and_route():
    """Each store's documented place, whole; the table has one row per fact (s, r), subject by subject."""
    assert [where_stored(store, 3) for store in DEPTH_STORES] == [
        {"layer": 0, "component": "attention", "route": "direct"},
        {"layer": 2, "component": "mlp", "route": "direct"},
        {"layer": 0, "component": "mlp", "route": "moved by layer 1 heads"},
        {"layer": None, "component": "none", "route": None}]
    assert where_stored("mlp", 4)["layer"] == 3
    assert storage_of([["attention", "mlp"], ["enriched", "none"]], 2) == [
        {"s": 0, "r": 0, "store": "attention", "layer": 0, "component": "attention", "route": "direct"},
        {"s": 0, "r": 1, "store": "mlp", "layer": 1, "component": "mlp", "route": "direct"},
        {"s": 1, "r": 0, "store": "enriched", "layer": 0, "component": "mlp", "route": "moved by layer 1 heads"},
        {"s": 1, "r": 1, "store": "none", "layer": None, "component": "none", "route": None}]
    table = storage_of(plan_of("(c) mixed"), 3)
    assert len(table) == TASK.n_subjects * TASK.n_relations
    assert {row["store"] for row in table} == {"attention", "mlp", "enriched", "none"}


def test_the_command_s_plans_are_the_documented_ones():
    """(a) every fact in the last MLP, (b) every fact enriched, (c) attention OV, last MLP and enriched
    in turn, fact (s, r) at (s + 2 r) mod 3."""
    task = CONSTRUCTION_TASK.build()  # S = 8, R = 4
    assert plan_for("last-mlp", task) == [["mlp"] * 4] * 8
    assert plan_for("enriched", task) == [["enriched"] * 4] * 8
    mixed = plan_for("mixed", task)
    assert len(mixed) == 8 and mixed[0] == ["attention", "enriched", "mlp", "attention"]
    assert mixed[1] == ["mlp", "attention", "enriched", "mlp"] and mixed[5] == mixed[2]


HEADS = "the depth constructions need d_head >= {} (a head's tokens) and n_heads * d_head >= d_vocab_out = {}; " \
    "raise --d-head or --n-heads."


@pytest.mark.parametrize("change, message", [
    (dict(n_layers=1), "the depth constructions need n_layers >= 2 and an MLP."),
    (dict(attn_only=True), "the depth constructions need n_layers >= 2 and an MLP."),
    (dict(d_model=44), "the depth constructions need d_model >= d_vocab + d_vocab_out + 18 = 45, got 44."),
    (dict(d_mlp=4), "the plan needs d_mlp >= 5 (a unit per fact kept in the last MLP, per subject enriched)."),
    (dict(n_heads=2, d_head=4), HEADS.format(6, 9)),
])
def test_a_depth_construction_that_cannot_be_exact_is_refused(change, message):
    cfg = ModelConfig(**{**dict(d_model=48, n_heads=3, d_head=4, d_mlp=18, n_layers=2), **change})
    with pytest.raises(ValueError) as refusal:
        build_depth(TASK, cfg, plan_of("(c) mixed"))
    assert str(refusal.value) == message


@pytest.mark.parametrize("task, heads, d_head, message", [
    (FactualRecallTask(12, 2, 2, 8, 8), 2, 4, HEADS.format(12, 4)),  # a head's 12 subjects; 8 >= 4 answers
    (FactualRecallTask(6, 3, 4, 8, 8), 3, 3, HEADS.format(3, 12)),  # 3 tokens a head fit; 9 < 12 answers
], ids=["a head's tokens", "the answers"])
def test_each_head_requirement_alone_refuses(task, heads, d_head, message):
    cfg = ModelConfig(d_model=64, n_heads=heads, d_head=d_head, d_mlp=24, n_layers=2)
    with pytest.raises(ValueError) as refusal:
        build_depth(task, cfg, [["mlp"] * task.n_relations] * task.n_subjects)
    assert str(refusal.value) == message


def test_the_smallest_d_model_the_refusal_names_is_exact():
    """d = d_vocab + 2 R D + S + R = 45 builds a construction with accuracy 1.0 on every stored fact."""
    plan = plan_of("(c) mixed")
    known, _ = margins(build_depth(TASK, ModelConfig(d_model=45, n_heads=3, d_head=4, d_mlp=18, n_layers=2), plan))
    assert torch.equal(known, torch.tensor([[float(x != "none") for x in row] for row in plan]))


@pytest.mark.parametrize("change", ["rows", "a row", "a store"])
def test_a_plan_not_one_known_store_per_fact_is_refused(change):
    plan = plan_of("(c) mixed")
    plan = {"rows": plan[:-1], "a row": [plan[0][:-1]] + plan[1:], "a store": [["elsewhere"] + plan[0][1:]] + plan[1:]}[
        change]
    with pytest.raises(ValueError) as refusal:
        build_depth(TASK, model(2), plan)
    assert str(refusal.value) == "plan must be [S=6][R=3] entries of ('attention', 'mlp', 'enriched', 'none')."


def test_the_command_writes_a_depth_construction_that_load_reads(tmp_path, capsys):
    """The record names the construction, its seed (0 by default: build_depth's embeddings), its accuracy
    and every fact's store; the model has the asked depth."""
    out = tmp_path / "mixed3"
    code, said, _ = run_main(deep_constructions.main, ["--kind", "mixed", "--n-layers", "3", "--out", out], capsys)
    assert code == 0 and "held-out accuracy 1.0000" in said
    checkpoint = load_checkpoint(out)
    task, cfg = CONSTRUCTION_TASK.build(), replace(deep_constructions.DEPTH_MODEL, n_layers=3)
    plan = plan_for("mixed", task)
    assert checkpoint.config["training"] == {
        "construction": "depth-mixed", "storage": "mixed", "seed": 0, "final_accuracy": 1.0,
        "answer_logit": ANSWER_LOGIT, "stores": storage_of(plan, 3)}
    assert torch.equal(checkpoint.weights["embed.W_E"], build_depth(task, cfg, plan)["embed.W_E"])
    model, _ = load(out, "cpu")
    assert model.cfg.n_layers == 3


def test_the_command_s_seed_and_task_flags_reach_the_construction(tmp_path, capsys):
    out = tmp_path / "last"
    code, _, _ = run_main(deep_constructions.main, ["--kind", "last-mlp", "--n-subjects", "6", "--seed", "3",
                                                    "--out", out], capsys)
    assert code == 0
    checkpoint = load_checkpoint(out)
    assert checkpoint.task.n_subjects == 6 and checkpoint.config["training"]["seed"] == 3
    assert checkpoint.config["training"]["stores"] == storage_of([["mlp"] * 4] * 6, 2)
    embeddings = {seed: build_depth(checkpoint.task, deep_constructions.DEPTH_MODEL,
                                    plan_for("last-mlp", checkpoint.task), seed=seed)["embed.W_E"] for seed in (0, 3)}
    assert torch.equal(checkpoint.weights["embed.W_E"], embeddings[3])
    assert not torch.equal(embeddings[3], embeddings[0])


def test_the_command_replaces_a_checkpoint_with_force_only(tmp_path, capsys):
    out = tmp_path / "c"
    assert run_main(deep_constructions.main, ["--kind", "enriched", "--out", out], capsys)[0] == 0
    code, _, err = run_main(deep_constructions.main, ["--kind", "mixed", "--out", out], capsys)
    assert code == 2 and err.strip().splitlines() == [
        f"error: --out {out} already holds files; pass --force to replace it, or choose another --out."]
    assert load_checkpoint(out).config["training"]["storage"] == "enriched"
    assert run_main(deep_constructions.main, ["--kind", "mixed", "--out", out, "--force"], capsys)[0] == 0
    assert load_checkpoint(out).config["training"]["storage"] == "mixed"


def test_the_command_s_help_states_each_kind_and_the_sizes_it_starts_from(capsys):
    code, said, _ = run_main(deep_constructions.main, ["--help"], capsys)
    text = " ".join(said.split())
    assert code == 0 and said.startswith("usage: python -m models.recall.deep_constructions [-h] --kind")
    assert "Hand-built L-layer models (L >= 2) whose storage is known fact by fact, in layer and component." in text
    for phrase in ["--kind {last-mlp,enriched,mixed} last-mlp: (a) facts in the last MLP; enriched: (b) in block 0's "
                   "MLP at the subject, moved by block 1's heads; mixed: (c) attention OV, last MLP and enriched, fact "
                   "by fact",
                   "--out OUT checkpoint directory to write", "--force " + FORCE_HELP,
                   "--seed SEED seed of the frozen random embeddings (default 0)",
                   "task: --n-subjects N_SUBJECTS S, number of subjects (default: 8)",
                   "--answers-per-relation ANSWERS_PER_RELATION D, answers per relation (|A_r|) (default: 4)",
                   "model: --d-model D_MODEL d, embedding dimension (default: 80)",
                   "--n-layers N_LAYERS L, number of layers (each attention, then the MLP), 1 to 4 (default: 2)"]:
        assert phrase in text, phrase


MIXED = ["--kind", "mixed", "--out", "OUT"]


@pytest.mark.parametrize("argv, message", [
    (MIXED + ["--n-layers", "1"], "the depth constructions need n_layers >= 2 and an MLP."),
    (MIXED + ["--n-layers", "5"], "n_layers must be an integer from 1 to 4, got 5."),
    (MIXED + ["--d-model", "60"], "the depth constructions need d_model >= d_vocab + d_vocab_out + 28 = 73, got 60."),
    (MIXED + ["--kind", "first-mlp"], "argument --kind: invalid choice: 'first-mlp' (choose from "),  # quoted or not
    (["--out", "OUT"], "the following arguments are required: --kind"),
    (["--kind", "mixed"], "the following arguments are required: --out"),
], ids=["L = 1", "L = 5", "d too small", "unknown kind", "no kind", "no out"])
def test_the_command_refuses_what_cannot_be_built_in_one_line(argv, message, tmp_path, capsys):
    out = tmp_path / "never"
    code, _, err = run_main(deep_constructions.main, [out if arg == "OUT" else arg for arg in argv], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: " + message)
    assert message.endswith("from ") or err.strip() == "error: " + message
    assert not out.exists()
