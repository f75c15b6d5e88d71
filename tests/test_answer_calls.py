"""TransformerLens's language-model calls on the analysis model, in the task's answer
vocabulary (models.answer_calls): return_type="loss" is the task's loss at the last position,
generate appends the answer by name; both families."""
import re

import pytest
import torch

from models import load
from models.aot.train import main as aot_train
from tasks import AssociationTask, DistributionTask


@pytest.fixture(scope="module")
def loaded(tiny_ckpt):
    return load(tiny_ckpt, device="cpu")


@pytest.fixture(scope="module", params=["association", "distribution"])
def attention_only(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("aot") / request.param
    assert aot_train([request.param, "--n-tokens", "5", "--batches", "10", "--epochs", "3", "--batch-size", "32",
                      "--lr", "0.02", "--device", "cpu", "--out", str(out), "--quiet"]) == 0
    return load(out, device="cpu")


def test_the_loss_is_the_task_s_cross_entropy_at_the_last_position(loaded):
    model, task = loaded
    batch = task.eval_set(32, seed=4)
    with torch.no_grad():
        logits = model(batch.tokens)  # [32, T, O]
        wanted = torch.nn.functional.cross_entropy(logits[:, -1], batch.answers, reduction="none")  # [32]
        loss = model(batch.tokens, return_type="loss")
        per_prompt = model(batch.tokens, return_type="loss", loss_per_token=True)
        both_logits, both_loss = model(batch.tokens, return_type="both")
    assert per_prompt.shape == (32, 1) and torch.allclose(per_prompt[:, 0], wanted, atol=1e-6)
    assert loss.item() == pytest.approx(wanted.mean().item(), rel=1e-5) and both_loss.item() == loss.item()
    assert torch.equal(both_logits, logits)
    assert model(model.to_tokens("S3 n5 R1 EOS"), return_type="loss").item() == pytest.approx(
        -model(model.to_tokens("S3 n5 R1 EOS"))[0, -1].log_softmax(-1)[int(task.facts[3, 1])].item(), rel=1e-5)


@pytest.mark.parametrize("prompt, counts", [("S3 S4 R1 EOS", "2 subjects and 1 relation"),
                                            ("S3 n1 n2 EOS", "1 subject and 0 relations")])
def test_a_prompt_without_one_subject_and_one_relation_is_refused_in_one_line(loaded, prompt, counts):
    model, _ = loaded
    wanted = rf"^return_type='loss' scores the task's prompts, .*prompt 0 has {re.escape(counts)}: read the logits "
    with pytest.raises(ValueError, match=wanted + r"at the last position instead: model\(tokens\)\[:, -1\]\.$"):
        model(model.to_tokens(prompt), return_type="loss")


def test_labels_are_refused_naming_what_to_use(loaded):
    model, task = loaded
    tokens = task.eval_set(2).tokens
    with pytest.raises(ValueError, match=r"^labels= is not read: .*model\(tokens\)\[:, -1\]\.$"):
        model(tokens, return_type="loss", labels=tokens)


def test_generate_appends_the_answer_by_name(loaded):
    model, task = loaded
    answer = task.answer_label(int(task.facts[3, 1]))
    assert model.generate("S3 R1 EOS", max_new_tokens=1, do_sample=False) == f"S3 R1 EOS {answer}"
    assert model.generate("S3 R1 EOS", do_sample=False) == f"S3 R1 EOS {answer}"  # one answer ends it
    assert model.generate("S3 R1 EOS", max_new_tokens=0) == "S3 R1 EOS"
    assert model.generate(["S3 R1 EOS", "S5 n2 R0 EOS"], do_sample=False, verbose=False) == [
        f"S3 R1 EOS {answer}", f"S5 n2 R0 EOS {task.answer_label(int(task.facts[5, 0]))}"]
    batch = task.eval_set(3, seed=1)
    texts = model.generate(batch.tokens, return_type="str", do_sample=False)
    assert texts == [f"{model.to_string(t)} {task.answer_label(int(a))}" for t, a in zip(batch.tokens, batch.answers)]
    torch.manual_seed(0)
    sampled = model.generate("S3 R1 EOS")  # TransformerLens's default: sampled (a trained model: its answer)
    assert sampled.rsplit(" ", 1)[1].startswith("R")


@pytest.mark.parametrize("call, message", [
    (lambda m, t: m.generate(t), "^generate's answer is an output id, which input tokens cannot hold"),
    (lambda m, t: m.generate("S3 R1 EOS", return_type="tokens"), "^generate's answer is an output id"),
    (lambda m, t: m.generate("S3 R1 EOS", top_k=3), "^generate on the task's model takes .* not top_k"),
])
def test_generate_refuses_what_cannot_hold_an_answer_in_one_line(loaded, call, message):
    model, task = loaded
    with pytest.raises(ValueError, match=message) as refused:
        call(model, task.eval_set(2).tokens)
    assert "\n" not in str(refused.value)


def test_the_attention_only_family_loss_and_generation_are_its_task_s(attention_only):
    model, task = attention_only
    every = task.prompts(torch.arange(task.n_sequences))  # all T_0 sequences
    with torch.no_grad():
        logits = model(every.tokens)[:, -1]  # [T_0, N]
        assert model(every.tokens, return_type="loss").item() == pytest.approx(task.scores(logits)["loss"].item(),
                                                                              rel=1e-5)
    assert isinstance(task, (AssociationTask, DistributionTask))
    i = 2 * task.n_tokens + 3  # the sequence t2 t3
    assert model.generate("t2 t3", do_sample=False) == f"t2 t3 t{int(logits[i].argmax())}"
    with pytest.raises(ValueError, match="prompts of different lengths .* cannot be padded"):
        model.to_tokens(["t1", "t1 t2"])
