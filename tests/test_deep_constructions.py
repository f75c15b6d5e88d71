"""The L-layer constructions of known storage (models.recall.deep_constructions): exact (accuracy
1.0), and each fact kept where its plan says: removing its store (and only its store) loses it."""
import pytest
import torch

from models.bridge import build_bridge
from models.cores.forward import last_position_logits
from models.recall.config import ModelConfig
from models.recall.constructions import ANSWER_LOGIT
from models.recall.deep_constructions import build_depth, storage_of, where_stored
from models.recall.weights import stack
from tasks.factual_recall import FactualRecallTask

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


def test_a_depth_construction_is_the_transformer_bridge_s_model():
    w = build_depth(TASK, model(3), plan_of("(c) mixed"))
    tokens = TASK.eval_set(256, 3).tokens
    bridge = build_bridge(model(3).checkpoint_section(TASK), w)
    with torch.no_grad():
        reference = bridge(tokens)[:, -1]
    assert (reference - last_position_logits(stack([w]), tokens[None])[0]).abs().max() <= 3e-5 * reference.abs().max()


def test_the_storage_table_names_layer_component_and_route():
    table = storage_of(plan_of("(c) mixed"), 3)
    assert len(table) == TASK.n_subjects * TASK.n_relations
    assert where_stored("mlp", 3) == {"layer": 2, "component": "mlp", "route": "direct"}
    assert where_stored("enriched", 3) == {"layer": 0, "component": "mlp", "route": "moved by layer 1 heads"}
    assert where_stored("attention", 4)["layer"] == 0 and where_stored("none", 4)["component"] == "none"
    assert {row["store"] for row in table} == {"attention", "mlp", "enriched", "none"}


@pytest.mark.parametrize("change, message", [
    (dict(n_layers=1), "n_layers >= 2"), (dict(attn_only=True), "an MLP"),
    (dict(d_model=40), "d_model >= "), (dict(d_mlp=4), "d_mlp >= "), (dict(n_heads=2, d_head=4), "n_heads \\* d_head"),
])
def test_a_depth_construction_that_cannot_be_exact_is_refused(change, message):
    cfg = ModelConfig(**{**dict(d_model=48, n_heads=3, d_head=4, d_mlp=18, n_layers=2), **change})
    with pytest.raises(ValueError, match=message):
        build_depth(TASK, cfg, plan_of("(c) mixed"))


def test_the_command_writes_a_depth_construction_that_load_reads(tmp_path, capsys):
    from models.bridge import load
    from models.checkpoint import load_checkpoint
    from models.recall import deep_constructions
    from tests.conftest import run_main

    out = tmp_path / "mixed3"
    code, said, _ = run_main(deep_constructions.main, ["--kind", "mixed", "--n-layers", "3", "--out", out], capsys)
    assert code == 0 and "held-out accuracy 1.0000" in said
    training = load_checkpoint(out).config["training"]
    assert training["final_accuracy"] == 1.0 and training["construction"] == "depth-mixed"
    assert {(row["store"], row["layer"], row["component"]) for row in training["stores"]} == {
        ("attention", 0, "attention"), ("mlp", 2, "mlp"), ("enriched", 0, "mlp")}
    model, _ = load(out, "cpu")
    assert model.cfg.n_layers == 3


@pytest.mark.parametrize("argv, message", [(["--n-layers", "1"], "n_layers >= 2"),
                                           (["--n-layers", "5"], "n_layers must be an integer from 1 to 4"),
                                           (["--d-model", "60"], "d_model >= ")])
def test_the_command_refuses_what_cannot_be_built_in_one_line(argv, message, tmp_path, capsys):
    from models.recall import deep_constructions
    from tests.conftest import run_main

    out = tmp_path / "never"
    code, _, err = run_main(deep_constructions.main, ["--kind", "mixed", "--out", out, *argv], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err
    assert not out.exists()
