"""The in-context associations task of Bietti et al. (2023), *Birth of a Transformer*: global
bigrams of a character-level text, and per-sequence trigger -> output associations that only an
induction head can read.

A vocabulary of N characters carries the text's unigram marginals pi_u and bigram conditionals
pi_b (counts shipped in tasks/data/, see tasks/data/README.md; nothing is downloaded). There are K
trigger tokens q_1..q_K: fixed (the K most frequent characters) or drawn per sequence from pi_u
without replacement. Each sequence draws one output o_k per trigger, uniform over the vocabulary
(or from pi_b(.|q_k)), then z_1 ~ pi_u and z_{t+1} = o_k if z_t = q_k, else z_{t+1} ~ pi_b(.|z_t):
T + 1 tokens, read as inputs z_1..z_T and targets z_2..z_{T+1}.

Each position carries the trigger counter of the authors' code: how many times its token, a
trigger, has fired so far, this position included (0 for a token that is no trigger). A target at
counter >= 2 is an in-context prediction: the trigger's output already appeared earlier in the
sequence. With `held_out_outputs`, outputs come from the first 3/4 of the vocabulary in training and
from the last 1/4 (never an output in training) in the out-of-distribution test.

Sampling (`sample_counter`) is vectorised over sequences and seeds on the device, from
counter-based values (tasks/counter.py) and integer count tables only: each seed's batch is a
function of its seed and the step, bit-identical on every device and in any stack.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from tasks import counter

DATA = Path(__file__).resolve().parent / "data"
TEXTS = {"shakespeare": DATA / "induction_shakespeare_counts.json"}
TRIGGERS = ("fixed", "random")
OUTPUTS = ("uniform", "bigram")
TRAIN_SHARE = 0.75  # the authors' split: training outputs among the first int(0.75 N) tokens


@functools.cache
def text_counts(text: str) -> tuple[str, torch.Tensor, torch.Tensor]:
    """(vocabulary, unigram counts [N], bigram counts [N, N]) of a named text (int64, CPU)."""
    if text not in TEXTS:
        raise ValueError(f"unknown text {text!r}; the texts are {', '.join(TEXTS)}.")
    data = json.loads(TEXTS[text].read_text())
    return data["vocabulary"], torch.tensor(data["unigrams"]), torch.tensor(data["bigrams"])


@dataclass(frozen=True)
class InductionBatch:
    """Sequences of the task on one device ([U, B, ...] from sample_counter, [B, ...] from eval_set)."""

    tokens: torch.Tensor  # [..., T] inputs z_1..z_T
    targets: torch.Tensor  # [..., T] next tokens z_2..z_{T+1}
    counts: torch.Tensor  # [..., T] trigger counter at each position (0: a bigram position)
    triggers: torch.Tensor  # [..., K] this sequence's triggers q_k
    outputs: torch.Tensor  # [..., K] their outputs o_k

    @property
    def answers(self) -> torch.Tensor:
        """The targets [..., T] (every task's `answers`: what the model should predict)."""
        return self.targets

    def __len__(self) -> int:
        return self.tokens.shape[-2]

    def to(self, device) -> InductionBatch:
        return InductionBatch(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))


@dataclass(frozen=True)
class CounterTables:
    """What the sampler reads, on one device: cumulative integer counts, so a draw is exact."""

    unigram_cdf: torch.Tensor  # [N] cumulative unigram counts
    bigram_cdf: torch.Tensor  # [N, N] cumulative bigram counts along each row
    unigrams: torch.Tensor  # [N]
    fixed_triggers: torch.Tensor  # [K] (fixed triggers) or [0]


def _draw(cdf: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Exact draws from integer counts: cdf [..., N] cumulative counts, values [...] uniform 32-bit
    -> i with cdf[i-1] <= r < cdf[i], r = floor(value * total / 2^32)."""
    r = counter.below(values, cdf[..., -1])  # [...]
    return torch.searchsorted(cdf, r[..., None], right=True)[..., 0]


class InductionTask:
    """The trigger task over a named text: N characters, K triggers, sequences of T inputs."""

    kind = "induction"
    character_level = True  # models.tokenizer: one character per token

    def __init__(self, text: str = "shakespeare", n_triggers: int = 5, seq_len: int = 256,
                 triggers: str = "fixed", outputs: str = "uniform", held_out_outputs: bool = False):
        self.text = text
        self.vocabulary, self.unigrams, self.bigrams = text_counts(text)  # str, [N], [N, N]
        N = len(self.vocabulary)
        if isinstance(n_triggers, bool) or not isinstance(n_triggers, int) or not 1 <= n_triggers <= N:
            raise ValueError(f"n_triggers must be an integer in 1..{N} (the vocabulary of {text!r}), "
                             f"got {n_triggers!r}.")
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
            raise ValueError(f"seq_len T must be an integer >= 2, got {seq_len!r}.")
        if triggers not in TRIGGERS:
            raise ValueError(f"triggers must be one of {', '.join(TRIGGERS)}, got {triggers!r}.")
        if outputs not in OUTPUTS:
            raise ValueError(f"outputs must be one of {', '.join(OUTPUTS)}, got {outputs!r}.")
        if held_out_outputs and outputs == "bigram":
            raise ValueError("held_out_outputs needs uniform outputs (bigram outputs range over every token).")
        self.n_triggers, self.seq_len, self.triggers, self.outputs = n_triggers, seq_len, triggers, outputs
        self.held_out_outputs = bool(held_out_outputs)
        self.n_train_outputs = int(TRAIN_SHARE * N) if held_out_outputs else N
        # the K most frequent characters (ties: the lower id first)
        order = sorted(range(N), key=lambda i: (-int(self.unigrams[i]), i))
        self.fixed_triggers = torch.tensor(sorted(order[:n_triggers]) if triggers == "fixed" else [], dtype=torch.long)
        self._tables: dict[torch.device, CounterTables] = {}

    # ------------------------------------------------------------------ vocabulary and statistics
    @property
    def n_tokens(self) -> int:
        return len(self.vocabulary)

    @property
    def d_vocab(self) -> int:
        return self.n_tokens

    @property
    def d_vocab_out(self) -> int:
        return self.n_tokens

    def token_label(self, token: int) -> str:
        """The character of an id."""
        if not 0 <= token < self.n_tokens:
            raise ValueError(f"token id {token} is outside the vocabulary 0..{self.n_tokens - 1}.")
        return self.vocabulary[token]

    def answer_label(self, answer: int) -> str:
        return self.token_label(answer)

    @property
    def marginal(self) -> torch.Tensor:
        """pi_u [N]: the unigram marginals (float32)."""
        return (self.unigrams.double() / self.unigrams.sum()).float()

    @property
    def conditionals(self) -> torch.Tensor:
        """pi_b [N, N]: row i the global bigram conditional pi_b(. | i) (float32)."""
        b = self.bigrams.double()
        return (b / b.sum(-1, keepdim=True)).float()

    # ------------------------------------------------------------------ sampling
    def counter_tables(self, device: torch.device | str) -> CounterTables:
        """The sampler's tables on `device`, built there once."""
        device = torch.device(device)
        if device not in self._tables:
            self._tables[device] = CounterTables(self.unigrams.cumsum(0).to(device),
                                                 self.bigrams.cumsum(-1).to(device), self.unigrams.to(device),
                                                 self.fixed_triggers.to(device))
        return self._tables[device]

    def sample_counter(self, batch_size: int, seeds: torch.Tensor, step: int | torch.Tensor,
                       ood: bool = False) -> InductionBatch:
        """Every seed's batch [U, B, ...] at `step` (seeds [U] int64 on the device). With `ood`,
        the outputs come from the held-out last quarter of the vocabulary."""
        tab = self.counter_tables(seeds.device)
        U, B, K, T, N = len(seeds), batch_size, self.n_triggers, self.seq_len, self.n_tokens
        values = counter.bits(seeds, step, B * (2 * K + T + 1)).view(U, B, 2 * K + T + 1)  # [U, B, W]
        trig_v, out_v, chain_v = values[..., :K], values[..., K:2 * K], values[..., 2 * K:]
        if self.triggers == "fixed":
            triggers = tab.fixed_triggers.expand(U, B, K)  # [U, B, K]
        else:  # K draws from pi_u without replacement: each from the counts not yet drawn
            left = tab.unigrams.expand(U, B, N).clone()  # [U, B, N]
            drawn = []
            for j in range(K):
                pick = _draw(left.cumsum(-1), trig_v[..., j])  # [U, B]
                left.scatter_(-1, pick[..., None], 0)
                drawn.append(pick)
            triggers = torch.stack(drawn, -1)  # [U, B, K]
        outputs = self._outputs(tab, triggers, out_v, ood)  # [U, B, K]
        follow = torch.full((U, B, N), -1, dtype=torch.long, device=seeds.device)  # [U, B, N] o_k at q_k, else -1
        follow.scatter_(-1, triggers, outputs)
        seq = [_draw(tab.unigram_cdf, chain_v[..., 0])]  # z_1 ~ pi_u, [U, B]
        for t in range(1, T + 1):
            prev = seq[-1]
            bigram = _draw(tab.bigram_cdf[prev], chain_v[..., t])  # [U, B] ~ pi_b(. | prev)
            forced = follow.gather(-1, prev[..., None])[..., 0]  # [U, B]
            seq.append(torch.where(forced >= 0, forced, bigram))
        seq = torch.stack(seq, -1)  # [U, B, T + 1]
        tokens = seq[..., :T]
        fired = tokens[..., None] == triggers[..., None, :]  # [U, B, T, K]
        counts = (fired.long().cumsum(-2) * fired).sum(-1)  # [U, B, T]
        return InductionBatch(tokens, seq[..., 1:], counts, triggers, outputs)

    def _outputs(self, tab: CounterTables, triggers: torch.Tensor, values: torch.Tensor, ood: bool) -> torch.Tensor:
        """o_k [U, B, K] for triggers [U, B, K] from uniform 32-bit values [U, B, K]."""
        if ood:
            if not self.held_out_outputs:
                raise ValueError("the out-of-distribution test needs a task with held_out_outputs.")
            return self.n_train_outputs + counter.below(values, self.n_tokens - self.n_train_outputs)
        if self.outputs == "bigram":
            return _draw(tab.bigram_cdf[triggers], values)
        return counter.below(values, self.n_train_outputs)

    def eval_set(self, n: int, seed: int = 1234, device: str | torch.device = "cpu",
                 ood: bool = False) -> InductionBatch:
        """A held-out set of `n` sequences, the same for every call with this seed, on `device`
        (drawn on the CPU: the same on every device); `ood`: the out-of-distribution test."""
        batch = self.sample_counter(n, torch.tensor([seed]), 0, ood)
        return InductionBatch(*(getattr(batch, f)[0].to(device) for f in InductionBatch.__dataclass_fields__))

    # ------------------------------------------------------------------ config
    def to_config(self) -> dict:
        return {"kind": self.kind, "text": self.text, "n_tokens": self.n_tokens, "n_triggers": self.n_triggers,
                "seq_len": self.seq_len, "triggers": self.triggers, "outputs": self.outputs,
                "held_out_outputs": self.held_out_outputs}

    @classmethod
    def from_config(cls, cfg: dict) -> InductionTask:
        """The task of a config.json `task` section (its n_tokens checked against the text's)."""
        if cfg.get("kind") != cls.kind:
            raise ValueError(f"task kind {cfg.get('kind')!r} is not {cls.kind!r}.")
        missing = [k for k in ("text", "n_triggers", "seq_len") if k not in cfg]
        if missing:
            raise ValueError(f"task section lacks {', '.join(missing)}.")
        task = cls(cfg["text"], cfg["n_triggers"], cfg["seq_len"], cfg.get("triggers", "fixed"),
                   cfg.get("outputs", "uniform"), cfg.get("held_out_outputs", False))
        if cfg.get("n_tokens", task.n_tokens) != task.n_tokens:
            raise ValueError(f"task.n_tokens {cfg['n_tokens']!r} differs from the {task.n_tokens} characters of "
                             f"text {task.text!r}.")
        return task

    def __repr__(self) -> str:
        return (f"InductionTask({self.text}, N={self.n_tokens}, K={self.n_triggers} {self.triggers} triggers, "
                f"T={self.seq_len}, {self.outputs} outputs{', held-out outputs' if self.held_out_outputs else ''})")
