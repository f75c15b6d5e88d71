"""The synthetic factual-recall task of Nichani, Lee & Bietti (2024).

A sequence of length T hides one subject token and one relation token at two distinct
random positions among the first T-1, fills the rest with noise, and ends with EOS. The
target is the answer a*(s, r) = facts[s, r], which lies in relation r's block of D answers.
Token layout (docs/checkpoint_format.md):

    inputs   0..S-1 subjects | S..S+R-1 relations | S+R..S+R+N-1 noise | S+R+N EOS
    outputs  relation r owns answers r*D .. (r+1)*D - 1, named R<r>:a<i> (answer_label)
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from tasks import counter, counter_sampler
from tasks.batch import Batch


def zipf_probs(n: int, alpha: float) -> torch.Tensor:
    """p(i) proportional to (i + 1)^-alpha for i in 0..n-1 (alpha = 0: uniform)."""
    ranks = torch.arange(1, n + 1, dtype=torch.float64)
    p = ranks ** (-float(alpha))
    return (p / p.sum()).float()


class FactualRecallTask:
    """S subjects, R relations, D answers per relation, N noise tokens, length T.

    `facts` is "random" (a*(s, r) uniform in A_r, drawn from `fact_seed`), "structured"
    (subject j -> floor(j*D/S) + r*D, the paper's Figure 5 table) or an explicit S x R
    table of answer ids.
    """

    kind = "factual_recall"

    def __init__(
        self,
        n_subjects: int,
        n_relations: int,
        answers_per_relation: int,
        n_noise: int,
        seq_len: int,
        subject_zipf: float = 0.0,
        relation_zipf: float = 0.0,
        facts: str | Sequence[Sequence[int]] | torch.Tensor = "random",
        fact_seed: int = 0,
    ):
        S, R, D, N, T = n_subjects, n_relations, answers_per_relation, n_noise, seq_len
        for name, value, low in [("n_subjects", S, 1), ("n_relations", R, 1),
                                 ("answers_per_relation", D, 1), ("n_noise", N, 0),
                                 ("seq_len", T, 3)]:
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}.")
        if T > 3 and N < 1:
            raise ValueError(f"n_noise must be >= 1 when seq_len > 3 (the other positions hold noise), got {N}.")
        for name, alpha in [("subject_zipf", subject_zipf), ("relation_zipf", relation_zipf)]:
            if not (isinstance(alpha, (int, float)) and 0 <= alpha < 100):
                raise ValueError(f"{name} must be a number in [0, 100), got {alpha!r}.")
        self.n_subjects, self.n_relations, self.answers_per_relation = S, R, D
        self.n_noise, self.seq_len = N, T
        self.subject_zipf, self.relation_zipf = float(subject_zipf), float(relation_zipf)
        self.facts = self._make_facts(facts, fact_seed)  # [S, R] answer ids (CPU)
        self.subject_probs = zipf_probs(S, self.subject_zipf)  # [S]
        self.relation_probs = zipf_probs(R, self.relation_zipf)  # [R]
        self.subject_ticks = counter.thresholds(self.subject_probs)  # [S] inverse CDF, units of 2^-32
        self.relation_ticks = counter.thresholds(self.relation_probs)  # [R]
        self._device_tables: dict[torch.device, tuple[torch.Tensor, ...]] = {}
        self._counter_tables: dict[torch.device, counter_sampler.CounterTables] = {}

    # ----------------------------------------------------------------- vocabulary
    @property
    def d_vocab(self) -> int:
        return self.n_subjects + self.n_relations + self.n_noise + 1

    @property
    def d_vocab_out(self) -> int:
        return self.n_relations * self.answers_per_relation

    @property
    def eos(self) -> int:
        return self.d_vocab - 1

    def relation_token(self, r):
        return self.n_subjects + r

    @property
    def noise_tokens(self) -> range:
        first = self.n_subjects + self.n_relations
        return range(first, first + self.n_noise)

    def token_label(self, token: int) -> str:
        """Readable name of an input id: S3, R1, n17 or EOS."""
        S, R = self.n_subjects, self.n_relations
        if token < S:
            return f"S{token}"
        if token < S + R:
            return f"R{token - S}"
        if token < S + R + self.n_noise:
            return f"n{token - S - R}"
        return "EOS"

    def answer_label(self, answer: int) -> str:
        """Readable name of an output (logit) id: R1:a3 is relation 1's answer 3, id 1*D + 3.
        Output ids overlap input ids (answer 3 is not subject S3): name each by its side."""
        if not 0 <= answer < self.d_vocab_out:
            raise ValueError(f"answer id {answer} is outside the task's answers 0..{self.d_vocab_out - 1}.")
        relation, index = divmod(int(answer), self.answers_per_relation)
        return f"R{relation}:a{index}"

    # ------------------------------------------------------------- answer sets
    def relation_answers(self, r: int) -> range:
        """A_r: the D answers relation r owns."""
        D = self.answers_per_relation
        return range(r * D, (r + 1) * D)

    def subject_answers(self, s: int) -> list[int]:
        """A_s = {a*(s, r') : r'}: the answers of subject s over all relations."""
        return self.facts[s].tolist()

    def all_facts(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every fact (s, r, a*(s, r)), subject-major: three [S*R] tensors."""
        S, R = self.n_subjects, self.n_relations
        subjects = torch.arange(S).repeat_interleave(R)
        relations = torch.arange(R).repeat(S)
        return subjects, relations, self.facts[subjects, relations]

    @property
    def n_facts(self) -> int:
        return self.n_subjects * self.n_relations

    # ---------------------------------------------------------------- sampling
    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        """Fresh prompts on the generator's device: (s, r) by their Zipf frequencies,
        an ordered pair of distinct positions among the first T-1, uniform noise, EOS."""
        device = generator.device
        S, R, N, T = self.n_subjects, self.n_relations, self.n_noise, self.seq_len
        facts, p_s, p_r = self._tables(device)
        B = batch_size
        subjects = self._draw(p_s, self.subject_zipf == 0, B, generator)  # [B]
        relations = self._draw(p_r, self.relation_zipf == 0, B, generator)  # [B]
        subject_pos = torch.randint(0, T - 1, (B,), generator=generator, device=device)
        relation_pos = torch.randint(0, T - 2, (B,), generator=generator, device=device)
        relation_pos += (relation_pos >= subject_pos).long()  # distinct from subject_pos
        if N > 0:
            tokens = torch.randint(S + R, S + R + N, (B, T), generator=generator, device=device)
        else:
            tokens = torch.empty((B, T), dtype=torch.long, device=device)
        rows = torch.arange(B, device=device)
        tokens[rows, subject_pos] = subjects
        tokens[rows, relation_pos] = S + relations
        tokens[:, -1] = self.eos
        return Batch(tokens, subjects, relations, facts[subjects, relations], subject_pos, relation_pos)

    def sample_counter(self, batch_size: int, seeds: torch.Tensor, step: int | torch.Tensor) -> Batch:
        """The prompts of every seed [K] (int64) at `step`, fields [K, batch, ...], in a fixed
        number of torch calls: `sample`'s distribution from counter-based values
        (tasks/counter.py), so each seed's batch depends on its seed and the step alone, the
        same in any stack and on any device (tasks.counter_sampler.counter_prompts)."""
        return counter_sampler.counter_prompts(self.counter_tables(seeds.device), batch_size, seeds, step)

    def counter_tables(self, device: torch.device) -> counter_sampler.CounterTables:
        """What sample_counter reads on `device`, built there once: a trainer builds them
        before its first step, so the step reads device tensors only."""
        if device not in self._counter_tables:
            self._counter_tables[device] = counter_sampler.CounterTables.of([self], device)
        return self._counter_tables[device]

    def eval_set(self, n: int, seed: int = 1234, device: str | torch.device = "cpu") -> Batch:
        """A held-out set: the same `n` prompts for every call with this seed, on `device`
        (drawn on the CPU and moved there: the same prompts on every device). Training draws
        from its own stream, so these are fresh samples of the population."""
        return self.sample(n, torch.Generator().manual_seed(seed)).to(device)

    def fact_prompts(self, subjects: torch.Tensor, relations: torch.Tensor,
                     generator: torch.Generator) -> Batch:
        """Prompts for given (s, r) pairs [n]: random positions and noise, facts fixed."""
        device = generator.device
        batch = self.sample(len(subjects), generator)
        subjects, relations = subjects.to(device), relations.to(device)
        rows = torch.arange(len(subjects), device=device)
        tokens = batch.tokens.clone()
        tokens[rows, batch.subject_pos] = subjects
        tokens[rows, batch.relation_pos] = self.n_subjects + relations
        facts = self._tables(device)[0]
        return Batch(tokens, subjects, relations, facts[subjects, relations],
                     batch.subject_pos, batch.relation_pos)

    # ------------------------------------------------------------- (de)serialise
    def to_config(self) -> dict:
        """The `task` section of config.json."""
        return {
            "kind": self.kind,
            "n_subjects": self.n_subjects, "n_relations": self.n_relations,
            "answers_per_relation": self.answers_per_relation,
            "n_noise": self.n_noise, "seq_len": self.seq_len,
            "subject_zipf": self.subject_zipf, "relation_zipf": self.relation_zipf,
            "facts": self.facts.tolist(),
        }

    @classmethod
    def from_config(cls, cfg: dict) -> FactualRecallTask:
        """The task of a config.json `task` section."""
        kind = cfg.get("kind", cls.kind)  # checkpoints may leave out the default kind
        if kind != cls.kind:
            raise ValueError(f"task kind {kind!r} is not a factual-recall task.")
        keys = ["n_subjects", "n_relations", "answers_per_relation", "n_noise", "seq_len", "facts"]
        missing = [k for k in keys if k not in cfg]
        if missing:
            raise ValueError(f"task section lacks {', '.join(missing)}.")
        return cls(cfg["n_subjects"], cfg["n_relations"], cfg["answers_per_relation"],
                   cfg["n_noise"], cfg["seq_len"], cfg.get("subject_zipf", 0.0),
                   cfg.get("relation_zipf", 0.0), facts=cfg["facts"])

    def __repr__(self) -> str:
        return (f"FactualRecallTask(S={self.n_subjects}, R={self.n_relations}, "
                f"D={self.answers_per_relation}, N={self.n_noise}, T={self.seq_len}, "
                f"subject_zipf={self.subject_zipf}, relation_zipf={self.relation_zipf})")

    # ---------------------------------------------------------------- internals
    def _make_facts(self, facts, fact_seed: int) -> torch.Tensor:
        S, R, D = self.n_subjects, self.n_relations, self.answers_per_relation
        block_start = torch.arange(R) * D  # [R]
        if isinstance(facts, str):
            if facts == "random":
                g = torch.Generator().manual_seed(fact_seed)
                return block_start + torch.randint(0, D, (S, R), generator=g)
            if facts == "structured":
                return (torch.arange(S) * D // S)[:, None] + block_start  # [S, R]
            raise ValueError(f"facts must be 'random', 'structured' or an S x R table, got {facts!r}.")
        try:
            table = torch.as_tensor(facts)
        except (TypeError, ValueError, RuntimeError, OverflowError):
            raise ValueError("facts must be an S x R table of integer answer ids.") from None
        if table.shape != (S, R):
            raise ValueError(f"facts must be an S x R = {S} x {R} table, got shape {tuple(table.shape)}.")
        if table.is_floating_point() or table.dtype == torch.bool:
            raise ValueError("facts must hold integer answer ids.")
        table = table.long()
        outside = (table < block_start) | (table >= block_start + D)
        if outside.any():
            s, r = (int(i) for i in outside.nonzero()[0])
            raise ValueError(f"fact ({s}, {r}) = {int(table[s, r])} lies outside relation {r}'s "
                             f"answer block {r * D}..{(r + 1) * D - 1}.")
        return table

    def _tables(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """Facts and sampling probabilities on `device`, copied there once."""
        if device not in self._device_tables:
            self._device_tables[device] = tuple(t.to(device) for t in (
                self.facts, self.subject_probs, self.relation_probs))
        return self._device_tables[device]

    @staticmethod
    def _draw(probs: torch.Tensor, uniform: bool, n: int, generator: torch.Generator) -> torch.Tensor:
        if uniform:  # randint is cheaper than multinomial
            return torch.randint(0, len(probs), (n,), generator=generator, device=probs.device)
        return torch.multinomial(probs, n, replacement=True, generator=generator)
