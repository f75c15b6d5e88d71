"""The task's vocabulary on the analysis model (TransformerLens string methods) and the
last-position metrics, used by TransformerLens's own `patching` functions."""
import re

import pytest
import torch
import transformer_lens.patching as tl_patching

from models import load
from probe.metrics import last_position_loss, logit_diff_metric, loss_metric
from probe.patching import corrupted_prompts
from probe.prompts import one_context_prompts
from tasks import AssociationTask, FactualRecallTask


@pytest.fixture(scope="module")
def loaded(tiny_ckpt):
    return load(tiny_ckpt, device="cpu")


def test_strings_round_trip_both_ways(loaded):
    model, task = loaded
    tokens = task.eval_set(4, seed=3).tokens  # [4, T]
    names = model.to_str_tokens(tokens[0])
    assert names == [task.token_label(int(t)) for t in tokens[0]]
    assert names[-1] == "EOS" and all(n[0] in "SRn" for n in names[:-1])
    assert torch.equal(model.to_tokens(" ".join(names)), tokens[:1])  # no BOS prepended
    assert torch.equal(model.to_tokens([model.to_string(row) for row in tokens]), tokens)
    S, R = task.n_subjects, task.n_relations
    assert model.to_single_token("S3") == 3 and model.to_single_token(f"R{R - 1}") == S + R - 1
    assert model.to_single_token("n7") == S + R + 7 and model.to_single_token("EOS") == task.eos
    assert model.to_str_tokens(torch.tensor([S + 1])) == ["R1"]


def test_an_unknown_token_is_named(loaded):
    model, _ = loaded
    with pytest.raises(ValueError, match="'S9999' is not a token of this task.*S0..S"):
        model.to_tokens("S9999 EOS")


@pytest.mark.parametrize("prompt", ["", "  ", ["S3 R1 EOS", ""]])
def test_an_empty_prompt_is_refused(loaded, prompt):
    model, _ = loaded
    with pytest.raises(ValueError, match=r"an empty prompt \('\s*'\) has no tokens; a prompt is token names"):
        model.to_tokens(prompt)


def test_a_string_prompt_runs_the_model(loaded):
    model, task = loaded
    tokens = task.eval_set(2, seed=5).tokens
    assert torch.equal(model(model.to_string(tokens[0]))[0], model(tokens[:1])[0])


def test_last_position_loss_is_the_task_loss(loaded):
    model, task = loaded
    batch = task.eval_set(64, seed=7)
    logits = model(batch.tokens)  # [n, T, O]
    manual = -logits[:, -1].log_softmax(-1).gather(-1, batch.answers[:, None]).mean()
    assert last_position_loss(logits, batch.answers).item() == pytest.approx(manual.item(), rel=1e-5)
    assert loss_metric(batch.answers, per_prompt=True)(logits).shape == (64,)


def test_tl_patching_runs_with_the_metric(loaded):
    """TransformerLens's patching with the logit-difference metric: patching the clean
    residual at the corrupted subject's position restores the clean metric exactly, at a
    noise position nothing changes."""
    model, task = loaded
    subjects = torch.arange(8) % task.n_subjects
    batch = one_context_prompts(task, subjects, torch.full((8,), 1), seed=0)
    position, relation_position = int(batch.subject_pos[0]), int(batch.relation_pos[0])
    answers = batch.answers
    corrupted, rivals = corrupted_prompts(task, batch, "subject", torch.Generator().manual_seed(1))
    assert (rivals >= 0).all()
    metric = logit_diff_metric(answers, rivals)
    clean_logits, clean_cache = model.run_with_cache(batch.tokens)
    clean, corrupt = metric(clean_logits).item(), metric(model(corrupted)).item()
    assert clean > corrupt + 1.0
    result = tl_patching.get_act_patch_resid_pre(model, corrupted, clean_cache, metric)  # [layer, pos]
    assert result[0, position].item() == pytest.approx(clean, abs=1e-4)
    noise = next(p for p in range(task.seq_len - 1) if p not in (position, relation_position))
    assert result[0, noise].item() == pytest.approx(corrupt, abs=1e-4)
    normalised = logit_diff_metric(answers, rivals, normalise=(clean, corrupt))
    heads = tl_patching.get_act_patch_attn_head_out_by_pos(model, corrupted, clean_cache, normalised)
    assert heads.shape == (1, task.seq_len, model.cfg.n_heads)
    assert heads[0, :-1].abs().max().item() < 1e-5  # only EOS reads the subject
    assert heads[0, -1].max().item() > 0.05


def test_association_tasks_get_their_tokens_too():
    from models.tokenizer import task_tokenizer

    tokenizer = task_tokenizer(AssociationTask(n_tokens=5, context=2))
    assert tokenizer.encode("t0 t4") == [0, 4] and tokenizer.decode([3, 1]) == "t3 t1"
    assert task_tokenizer(FactualRecallTask(2, 2, 2, 3, 4)).get_vocab()["EOS"] == 7


@pytest.mark.parametrize("normalise, message", [
    ((torch.zeros(4, 12, 8), torch.zeros(4, 12, 8)), "clean must be one number"),
    ((1.0, torch.zeros(3)), "corrupted must be one number"),
    ((2.0, 2.0), "are equal"),
    ((1.0, float("nan")), "finite number"),
    (1.0, "must be (clean, corrupted)"),
])
def test_the_normalised_metric_refuses_what_is_not_two_numbers(normalise, message):
    answers, rivals = torch.tensor([0, 1]), torch.tensor([1, 0])
    with pytest.raises(ValueError, match=re.escape(message)):
        logit_diff_metric(answers, rivals, normalise=normalise)
    logits = torch.tensor([[[3.0, 1.0]], [[0.0, 2.0]]])  # [batch, pos, answer]: logit differences 2 and 2
    assert logit_diff_metric(answers, rivals, normalise=(torch.tensor(4.0), 0.0))(logits).item() == 0.5


def test_answers_are_named_by_their_relation_not_as_subjects(loaded):
    """Output ids overlap input ids: answer 3 is relation 0's answer, not subject S3."""
    model, task = loaded
    D = task.answers_per_relation
    assert task.answer_label(3) == "R0:a3" and task.answer_label(D + 2) == "R1:a2"
    batch = task.eval_set(6, seed=2)
    with torch.inference_mode():
        predicted = model(batch.tokens)[:, -1].argmax(-1)  # [6] output ids
    named = model.to_str_tokens(predicted, answers=True)
    assert named == [f"R{int(a) // D}:a{int(a) % D}" for a in predicted]
    assert [name.split(":")[0] for name in model.to_str_tokens(batch.answers, answers=True)] == \
        [f"R{int(r)}" for r in batch.relations]  # a* lies in its relation's block
    assert model.to_str_tokens(torch.tensor([[3, D]]), answers=True) == [["R0:a3", "R1:a0"]]
    assert model.to_str_tokens(3, answers=True) == ["R0:a3"]
    assert model.to_str_tokens(torch.tensor([3])) == ["S3"]  # the input side is TransformerLens's
    with pytest.raises(ValueError, match=f"answer id {task.d_vocab_out} is outside the task's answers"):
        model.to_str_tokens([task.d_vocab_out], answers=True)
    assert AssociationTask(n_tokens=5, context=2).answer_label(4) == "t4"
