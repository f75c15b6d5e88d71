"""The memorisation tasks of Dana, Pydi & Chevaleyre (attention-only memorisation).

A sequence t_1..t_S of S = `context` tokens over a vocabulary of N tokens is followed by a
next token; the model is read at the last position only. The prior over sequences is
uniform over all T_0 = N^S of them (sequence i is i written in base N, first token most
significant), so the whole population fits in one tensor and accuracy is exact.

- Association task (`kind = "association"`): each sequence has one next token (a
  deterministic look-up table drawn uniformly at random); scored by accuracy (the share of
  the T_0 associations memorised) and trained with cross-entropy.
- Distribution task (`kind = "distribution"`): each sequence has a full-support target
  distribution pi_t = softmax(concentration * g_t), g_t ~ N(0, I_N); trained and scored
  with KL(pi_t || model), in nats, averaged over sequences. A rank-d model cannot go below
  the floor of probe.kl_floor when d < N - 1.

Token layout: inputs and outputs are the same N tokens (d_vocab = d_vocab_out = N), n_ctx = S.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch


def _positive_int(name: str, value, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}.")
    return value


@dataclass(frozen=True)
class SequenceBatch:
    """Prompts of a memorisation task and what the model should answer, on one device: the
    fields of factual recall's Batch that both tasks have."""

    tokens: torch.Tensor  # [batch, S] input ids
    sequences: torch.Tensor  # [batch] each prompt's index among the T_0 sequences (its row of the targets)
    answers: torch.Tensor  # [batch] the next token (distribution task: its most likely one)

    def __len__(self) -> int:
        return self.tokens.shape[-2]


class SequenceTask:
    """Shared by both tasks: N tokens, sequences of length S, uniform prior over all N^S."""

    kind = "sequence"
    MAX_SEQUENCES = 10_000_000
    TABLES: tuple[str, ...] = ()  # the tensors that define the task: scoring and training read them

    def __init__(self, n_tokens: int, context: int):
        self.n_tokens = _positive_int("n_tokens", n_tokens, 2)
        self.context = _positive_int("context", context, 1)
        if n_tokens ** context > self.MAX_SEQUENCES:
            raise ValueError(f"n_tokens^context = {n_tokens}^{context} sequences is more than "
                             f"{self.MAX_SEQUENCES:,}; choose a smaller task.")

    @property
    def n_sequences(self) -> int:
        """T_0, the number of sequences with non-zero probability."""
        return self.n_tokens ** self.context

    @property
    def d_vocab(self) -> int:
        return self.n_tokens

    @property
    def d_vocab_out(self) -> int:
        return self.n_tokens

    @property
    def seq_len(self) -> int:
        return self.context

    def token_label(self, token: int) -> str:
        return f"t{token}"

    def answer_label(self, answer: int) -> str:
        """Readable name of an output (logit) id: the next token, named as an input token."""
        if not 0 <= answer < self.d_vocab_out:
            raise ValueError(f"answer id {answer} is outside the task's tokens 0..{self.d_vocab_out - 1}.")
        return self.token_label(answer)

    def sequences(self, index: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids [..., S] of the sequences with these indices [...] (default: all T_0,
        in order): index i written in base N, most significant token first."""
        if index is None:
            index = torch.arange(self.n_sequences)
        powers = self.n_tokens ** torch.arange(self.context - 1, -1, -1, device=index.device)  # [S]
        return (index[..., None] // powers) % self.n_tokens

    def index_of(self, tokens: torch.Tensor) -> torch.Tensor:
        """The index [batch] of each sequence among the T_0 (the inverse of `sequences`), from its
        token ids [batch, S]; a prompt of another length or with an id outside the N tokens is
        refused (ValueError)."""
        if tokens.dim() != 2 or tokens.shape[1] != self.context:
            raise ValueError(f"a prompt of this task is S = {self.context} tokens, got shape {tuple(tokens.shape)}.")
        if ((tokens < 0) | (tokens >= self.n_tokens)).any():
            raise ValueError(f"token ids must lie in 0..{self.n_tokens - 1}.")
        powers = self.n_tokens ** torch.arange(self.context - 1, -1, -1, device=tokens.device)  # [S]
        return (tokens * powers).sum(-1)

    def sample_index(self, batch_size: int, generator: torch.Generator) -> torch.Tensor:
        """Sequence indices [batch] drawn from the uniform prior."""
        return torch.randint(0, self.n_sequences, (batch_size,), generator=generator, device=generator.device)

    def to(self, device: str | torch.device) -> SequenceTask:
        """This task with its tables (TABLES) on `device`: a trainer moves its task there once,
        so a step reads only device tensors (a CUDA graph cannot copy from the host)."""
        moved = copy.copy(self)
        for name in self.TABLES:
            setattr(moved, name, getattr(self, name).to(device))
        return moved

    def prompts(self, index: torch.Tensor) -> SequenceBatch:
        """The sequences with these indices [batch] and their answers, on the indices' device."""
        return SequenceBatch(self.sequences(index), index, self.answers(index))

    def sample(self, batch_size: int, generator: torch.Generator) -> SequenceBatch:
        """Fresh prompts on the generator's device, drawn from the uniform prior (as factual
        recall's `sample`)."""
        return self.prompts(self.sample_index(batch_size, generator))

    def eval_set(self, n: int, seed: int = 1234, device: str | torch.device = "cpu") -> SequenceBatch:
        """A held-out set, as factual recall's: the same `n` prompts for every call with this
        seed, on `device` (drawn on the CPU, so every device reads the same prompts). The
        population is finite, so the trainers score every one of the T_0 sequences (`scores`);
        this is for reading the model on a few, through its hooks."""
        cpu = self.to("cpu")  # drawn on the CPU and moved: the same prompts on every device
        batch = cpu.sample(n, torch.Generator().manual_seed(seed))
        return SequenceBatch(*(field.to(device) for field in (batch.tokens, batch.sequences, batch.answers)))

    def answers(self, index: torch.Tensor) -> torch.Tensor:
        """The answer [batch] of the sequences with these indices [batch]."""
        raise NotImplementedError

    def _base_config(self) -> dict:
        return {"kind": self.kind, "n_tokens": self.n_tokens, "context": self.context, "seq_len": self.seq_len}

    @classmethod
    def _check_config(cls, cfg: dict) -> None:
        """Refuse a config.json `task` section of another kind, or without the shared fields."""
        if cfg.get("kind") != cls.kind:
            raise ValueError(f"task kind {cfg.get('kind')!r} is not {cls.kind!r}.")
        missing = [k for k in ("n_tokens", "context") if k not in cfg]
        if missing:
            raise ValueError(f"task section lacks {', '.join(missing)}.")
        if "seq_len" in cfg and cfg["seq_len"] != cfg["context"]:
            raise ValueError(f"task.seq_len {cfg['seq_len']!r} differs from task.context {cfg['context']!r}.")


class AssociationTask(SequenceTask):
    """Each of the N^S sequences maps to one next token, drawn uniformly from `table_seed`
    (or given as an explicit list `next_tokens` of T_0 ids)."""

    kind = "association"
    TABLES = ("next_tokens",)

    def __init__(self, n_tokens: int = 50, context: int = 2, table_seed: int = 0,
                 next_tokens: list[int] | torch.Tensor | None = None):
        super().__init__(n_tokens, context)
        self.table_seed = table_seed
        if next_tokens is None:
            g = torch.Generator().manual_seed(table_seed)
            self.next_tokens = torch.randint(0, n_tokens, (self.n_sequences,), generator=g)  # [T_0]
        else:
            try:
                table = torch.as_tensor(next_tokens)
            except (TypeError, ValueError, RuntimeError, OverflowError):
                raise ValueError("next_tokens must be a list of integer token ids.") from None
            if table.shape != (self.n_sequences,) or table.is_floating_point() or table.dtype == torch.bool:
                raise ValueError(f"next_tokens must list {self.n_sequences} integer token ids (one per sequence), "
                                 f"got shape {tuple(table.shape)} of {table.dtype}.")
            if ((table < 0) | (table >= n_tokens)).any():
                raise ValueError(f"next_tokens must lie in 0..{n_tokens - 1}.")
            self.next_tokens = table.long()

    def answers(self, index: torch.Tensor) -> torch.Tensor:
        """The next token [batch] of the sequences with these indices [batch]."""
        return self.next_tokens.to(index.device)[index]

    def sequence_losses(self, logits: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
        """Cross-entropy (nats) of each sequence's next token: logits [..., T_0, N] on the
        whole population -> [..., T_0], or [..., n, N] on the sequences `index` [n] -> [..., n]."""
        target = self.next_tokens.to(logits.device)  # [T_0]
        target = target if index is None else target[index.to(logits.device)]
        return -logits.log_softmax(-1).gather(-1, target.expand(logits.shape[:-1])[..., None])[..., 0]

    def sequence_correct(self, logits: torch.Tensor) -> torch.Tensor:
        """1 where the sequence's next token gets the top logit: logits [..., T_0, N] -> [..., T_0]."""
        return (logits.argmax(-1) == self.next_tokens.to(logits.device)).float()

    def scores(self, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        """On the whole population (logits [..., T_0, N]): `accuracy` (share of the T_0
        associations whose next token gets the top logit) and `loss` (mean cross-entropy, nats)."""
        return {"accuracy": self.sequence_correct(logits).mean(-1), "loss": self.sequence_losses(logits).mean(-1)}

    def to_config(self) -> dict:
        return {**self._base_config(), "table_seed": self.table_seed, "next_tokens": self.next_tokens.tolist()}

    @classmethod
    def from_config(cls, cfg: dict) -> AssociationTask:
        """The task of a config.json `task` section."""
        cls._check_config(cfg)
        return cls(cfg["n_tokens"], cfg["context"], cfg.get("table_seed", 0), cfg.get("next_tokens"))

    def __repr__(self) -> str:
        return f"AssociationTask(N={self.n_tokens}, S={self.context}, T_0={self.n_sequences})"


class DistributionTask(SequenceTask):
    """Each sequence t has a full-support target pi_t = softmax(concentration * g_t),
    g_t ~ N(0, I_N) drawn from `target_seed`: 0 is uniform, large is nearly a look-up table."""

    kind = "distribution"
    TABLES = ("log_targets",)

    def __init__(self, n_tokens: int = 50, context: int = 2, target_seed: int = 0, concentration: float = 1.0):
        super().__init__(n_tokens, context)
        if (isinstance(concentration, bool) or not isinstance(concentration, (int, float))
                or not 0 <= concentration <= 50):
            raise ValueError(f"concentration must be a number in [0, 50], got {concentration!r}.")
        self.target_seed, self.concentration = target_seed, float(concentration)
        g = torch.Generator().manual_seed(target_seed)
        logits = self.concentration * torch.randn(self.n_sequences, n_tokens, generator=g, dtype=torch.float64)
        self.log_targets = logits.log_softmax(-1).float()  # [T_0, N] log pi_t, finite: full support

    def answers(self, index: torch.Tensor) -> torch.Tensor:
        """The most likely next token [batch] under pi_t of the sequences with these indices [batch]."""
        return self.log_targets.to(index.device).argmax(-1)[index]

    def sequence_losses(self, logits: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
        """KL(pi_t || softmax(logits_t)) in nats per sequence: logits [..., T_0, N] on the
        whole population -> [..., T_0], or [..., n, N] on the sequences `index` [n] -> [..., n]."""
        log_pi = self.log_targets.to(logits.device)  # [T_0, N]
        log_pi = log_pi if index is None else log_pi[index.to(logits.device)]
        return (log_pi.exp() * (log_pi - logits.log_softmax(-1))).sum(-1)

    def sequence_correct(self, logits: torch.Tensor) -> torch.Tensor:
        """1 where the sequence's most likely next token gets the top logit: [..., T_0, N] -> [..., T_0]."""
        return (logits.argmax(-1) == self.log_targets.to(logits.device).argmax(-1)).float()

    def scores(self, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        """On the whole population (logits [..., T_0, N]): `loss` (mean KL, nats) and
        `accuracy` (share of sequences whose most likely next token gets the top logit)."""
        return {"accuracy": self.sequence_correct(logits).mean(-1), "loss": self.sequence_losses(logits).mean(-1)}

    def to_config(self) -> dict:
        return {**self._base_config(), "target_seed": self.target_seed, "concentration": self.concentration}

    @classmethod
    def from_config(cls, cfg: dict) -> DistributionTask:
        """The task of a config.json `task` section."""
        cls._check_config(cfg)
        return cls(cfg["n_tokens"], cfg["context"], cfg.get("target_seed", 0), cfg.get("concentration", 1.0))

    def __repr__(self) -> str:
        return (f"DistributionTask(N={self.n_tokens}, S={self.context}, T_0={self.n_sequences}, "
                f"concentration={self.concentration:g})")

