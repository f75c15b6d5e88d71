"""The task's vocabulary as a tokenizer, so a TransformerLens user's string methods work on
the analysis model: `model.to_tokens("S3 n5 R1 EOS")`, `model.to_str_tokens(tokens)`,
`model.to_single_token("R1")`, `model.to_string(tokens)`; and answers:
`model.to_str_tokens(logits.argmax(-1), answers=True)` names output ids (R1:a3).

A prompt is its token names separated by spaces, the names being the task's labels of its
input ids (factual recall: S<s> subjects, R<r> relations, n<i> noise, EOS). Nothing is
downloaded: the vocabulary is built from the task. A name the task does not have is
refused with one line naming it, and so is an empty prompt (it has no last position to read).
No BOS is prepended: the task's prompts have none.

Output (logit) ids are not input ids: answer 3 is relation 0's answer R0:a3, not subject S3.
TransformerLens's `to_str_tokens` names input ids only; the analysis model's takes
`answers=True` to name output ids by the task's `answer_label`.
"""
from __future__ import annotations

import torch
from transformers import PreTrainedTokenizer

EOS = "EOS"


class TaskTokenizer(PreTrainedTokenizer):
    """Word-level tokenizer over a task's input labels (label i <-> id i), split on spaces."""

    model_input_names = ["input_ids"]

    def __init__(self, labels: list[str], pad: str | None = None, **kwargs):
        if len(set(labels)) != len(labels):
            raise ValueError("token labels must be distinct.")
        self.labels = list(labels)
        self.ids = {label: i for i, label in enumerate(self.labels)}
        eos = EOS if EOS in self.ids else None
        super().__init__(eos_token=eos, pad_token=pad or eos, padding_side="right", **kwargs)

    def __call__(self, text=None, *args, **kwargs):
        """HF's tokenizer call; prompts of one length need no padding, which a vocabulary
        without EOS (the attention-only family's) has no token for: a batch of several
        lengths is refused there in one line."""
        if self.pad_token is None and kwargs.get("padding"):
            lengths = {len(t.split()) for t in ([text] if isinstance(text, str) else text)}
            if len(lengths) > 1:
                raise ValueError(f"prompts of different lengths ({', '.join(map(str, sorted(lengths)))} tokens) "
                                 "cannot be padded: this task has no padding token; tokenize one length at a time.")
            kwargs["padding"] = False
        return super().__call__(text, *args, **kwargs)

    @property
    def vocab_size(self) -> int:
        return len(self.labels)

    def get_vocab(self) -> dict[str, int]:
        return dict(self.ids)

    def tokenize(self, text: str, **kwargs) -> list[str]:
        if not text.split():
            raise ValueError(f"an empty prompt ({text!r}) has no tokens; a prompt is token names separated by "
                             f"spaces, e.g. '{' '.join(self.labels[:2])} {self.labels[-1]}'.")
        return super().tokenize(text, **kwargs)

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        return text.split()

    def _convert_token_to_id(self, token: str) -> int:
        if token not in self.ids:
            raise ValueError(f"{token!r} is not a token of this task; its tokens are "
                             f"{self._summary()}.")
        return self.ids[token]

    def _convert_id_to_token(self, index: int) -> str:
        return self.labels[index]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return " ".join(tokens)

    def _summary(self) -> str:
        """The vocabulary in short: first and last label of each run of one prefix."""
        runs: list[list[str]] = []
        for label in self.labels:
            prefix = label.rstrip("0123456789")
            if runs and runs[-1][0].rstrip("0123456789") == prefix:
                runs[-1][1:] = [label]
            else:
                runs.append([label])
        return ", ".join("..".join(run) for run in runs)


class CharacterTokenizer(TaskTokenizer):
    """One token per character (a character-level task: the induction task's text); a prompt is
    its characters as they are, spaces and newlines included."""

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        return list(text)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return "".join(tokens)

    def _summary(self) -> str:
        return repr("".join(self.labels))


def task_tokenizer(task) -> TaskTokenizer:
    """The tokenizer of a task's input vocabulary (any task kind: its `token_label`s; characters
    for a character-level task)."""
    labels = [task.token_label(i) for i in range(task.d_vocab)]
    if getattr(task, "character_level", False):
        return CharacterTokenizer(labels, pad=labels[0])  # to_tokens pads (one string: never)
    return TaskTokenizer(labels)


def attach_tokenizer(bridge, task) -> None:
    """Give `bridge` the task's tokenizer, the TransformerLens way (`bridge.tokenizer`), with
    no BOS prepended or detected."""
    bridge.cfg.default_prepend_bos = False
    bridge.tokenizer = task_tokenizer(task)
    bridge.cfg.tokenizer_prepends_bos = False
    bridge.cfg.tokenizer_appends_eos = False
    bridge.to_str_tokens = _naming_answers(bridge.to_str_tokens, task)


def _naming_answers(to_str_tokens, task):
    """TransformerLens's `to_str_tokens`, plus `answers=True`: output ids (any shape: a
    tensor, an array, a list, an int) named by the task's answer labels, nested as given."""
    def named(input, prepend_bos=None, padding_side=None, answers: bool = False):
        if not answers:
            return to_str_tokens(input, prepend_bos, padding_side)
        if isinstance(input, str):
            raise ValueError("answers=True names answer ids; a string holds input tokens.")
        ids = torch.as_tensor(input).tolist()

        def name(x):
            return [name(v) for v in x] if isinstance(x, list) else task.answer_label(x)
        return name(ids) if isinstance(ids, list) else [name(ids)]
    return named
