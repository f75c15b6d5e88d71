"""TransformerLens's language-model calls on the analysis model, in the task's answer
vocabulary: `model(tokens, return_type="loss")` and `model.generate(prompt)`.

A TransformerLens model predicts the next input token at every position. These models are
read at the last position only, and their logits are over the task's answers (output ids,
d_vocab_out of them), not its input tokens: answer 7 is relation 1's answer R1:a3, not the
subject S7. So, on the model `models.load` gives (either family):

- `return_type="loss"` (and "both") is the task's loss at the last position, the number the
  trainer reports: the cross-entropy of each prompt's answer (factual recall: facts[s, r] of
  its subject and relation; association: the table's next token of the sequence), or the
  distribution task's KL(pi_t || model), in nats; the mean over prompts, or [batch, 1] with
  `loss_per_token=True`.
- `generate` appends the model's answer, named: `model.generate("S3 R1 EOS")` ->
  'S3 R1 EOS R1:a3'. One answer ends the continuation (as EOS ends a text): nothing can
  follow it, since an answer is not an input token. Sampling as TransformerLens's
  (`do_sample=True`, `temperature`; `do_sample=False` for the top answer).

What has no meaning here is refused in one line naming what to use instead.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from models.text import count
from tasks.association import SequenceTask

# generate's TransformerLens arguments that change nothing here: one answer at the last position
NO_EFFECT = ("stop_at_eos", "eos_token_id", "use_past_kv_cache", "prepend_bos", "padding_side", "verbose")
READ_LOGITS = "read the logits at the last position instead: model(tokens)[:, -1]"


def fact_answers(task, tokens: torch.Tensor) -> torch.Tensor:
    """The answer id [batch] of factual-recall prompts [batch, T]: facts[s, r] of the one
    subject and the one relation each holds (refused, ValueError, where a prompt holds
    another number of either)."""
    S, R = task.n_subjects, task.n_relations
    subject, relation = tokens < S, (tokens >= S) & (tokens < S + R)  # [batch, T]
    counts = torch.stack([subject.sum(-1), relation.sum(-1)], -1)  # [batch, 2]
    wrong = (counts != 1).any(-1).nonzero()
    if len(wrong):
        i = int(wrong[0])
        n_s, n_r = counts[i].tolist()
        raise ValueError(f"return_type='loss' scores the task's prompts, each with one subject and one relation; "
                         f"prompt {i} has {count(n_s, 'subject')} and {count(n_r, 'relation')}: {READ_LOGITS}.")
    s, r = (tokens * subject).sum(-1), ((tokens - S) * relation).sum(-1)  # [batch]
    return task.facts.to(tokens.device)[s, r]


def answer_losses(task, tokens: torch.Tensor, last_logits: torch.Tensor) -> torch.Tensor:
    """The task's loss (nats) of each prompt [batch, T] from its last-position logits
    [batch, d_vocab_out]: cross-entropy of its answer, or the distribution task's KL."""
    if isinstance(task, SequenceTask):
        return task.sequence_losses(last_logits, task.index_of(tokens))
    return F.cross_entropy(last_logits, fact_answers(task, tokens), reduction="none")


def attach_answer_calls(bridge, task) -> None:
    """Make `bridge`'s return_type="loss" and `generate` the task's (module docstring)."""
    def loss_fn(logits, tokens, attention_mask=None, per_token: bool = False):
        """The task's loss at the last position: the mean over prompts, or [batch, 1]."""
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            raise ValueError("return_type='loss' reads each prompt's last position: score prompts of one length "
                             "at a time (no padding).")
        losses = answer_losses(task, tokens.to(logits.device), logits[:, -1].float())  # [batch]
        return losses[:, None] if per_token else losses.mean()

    def labels_loss(logits, labels, attention_mask=None, per_token: bool = False):
        raise ValueError("labels= is not read: each prompt's target is the task's answer to it, which "
                         "return_type='loss' finds in the prompt; for other targets, " + READ_LOGITS + ".")

    bridge.loss_fn = loss_fn
    bridge._causal_labels_loss = labels_loss
    bridge.generate = _generate(bridge, task)


def _generate(bridge, task):
    def generate(input="", max_new_tokens: int = 10, do_sample: bool = True, temperature: float = 1.0,
                 return_type: str | None = "input", **options):
        """The prompt(s) with the model's answer appended by name ('S3 R1 EOS R1:a3'):
        sampled (do_sample, temperature) or the top answer; a string for a string, a list
        for a list or a batch of tokens (return_type 'str')."""
        unknown = sorted(k for k in options if k not in NO_EFFECT)
        if unknown:
            raise ValueError(f"generate on the task's model takes input, max_new_tokens, do_sample, temperature and "
                             f"return_type, not {', '.join(unknown)}: its one answer is read at the last position.")
        tensor = isinstance(input, torch.Tensor)
        if return_type == "tokens" or (tensor and return_type in ("input", None)):
            raise ValueError("generate's answer is an output id, which input tokens cannot hold: pass "
                             "return_type='str' for text, or read the answer ids as model(tokens)[:, -1].argmax(-1) "
                             "and name them with model.to_str_tokens(ids, answers=True).")
        if tensor:
            rows = input[None] if input.dim() == 1 else input
            prompts = [bridge.to_string(row) for row in rows]
        else:
            prompts = [input] if isinstance(input, str) else list(input)
        answered = [_answered(bridge, task, p, do_sample, temperature) if max_new_tokens >= 1 else p
                    for p in prompts]
        single = isinstance(input, str) or (tensor and input.dim() == 1)
        return answered[0] if single else answered
    return generate


def _answered(bridge, task, prompt: str, do_sample: bool, temperature: float) -> str:
    """`prompt` and the model's answer to it, named."""
    tokens = bridge.to_tokens(prompt)  # [1, T]
    with torch.no_grad():
        logits = bridge(tokens)[0, -1].float()  # [d_vocab_out]
    if do_sample and temperature > 0:  # temperature 0: the top answer, as TransformerLens
        answer = torch.multinomial((logits / temperature).softmax(-1), 1)
    else:
        answer = logits.argmax(-1)
    return f"{prompt} {task.answer_label(int(answer))}"
