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
from dataclasses import dataclass, fields

import torch

from tasks import counter, triton_kernels

COUNTER_BLOCK_B, COUNTER_BLOCK_TICKS = 32, 64  # the counter sampler's kernel: prompts per program, thresholds per pass


@dataclass(frozen=True)
class Batch:
    """One batch of prompts and their targets, all on one device (with a leading model axis
    [K, ...] on every field when drawn by sample_counter)."""

    tokens: torch.Tensor  # [batch, T] input ids, EOS last
    subjects: torch.Tensor  # [batch] subject index s in 0..S-1
    relations: torch.Tensor  # [batch] relation index r in 0..R-1
    answers: torch.Tensor  # [batch] answer id a*(s, r) in 0..R*D-1
    subject_pos: torch.Tensor  # [batch] position of the subject token
    relation_pos: torch.Tensor  # [batch] position of the relation token

    def __len__(self) -> int:
        return self.tokens.shape[-2]

    def to(self, device: str | torch.device) -> Batch:
        """The same prompts with every field on `device`."""
        return Batch(*(getattr(self, f.name).to(device) for f in fields(self)))


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
        self._counter_tables: dict[torch.device, CounterTables] = {}

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
        same in any stack and on any device (counter_prompts)."""
        return counter_prompts(self.counter_tables(seeds.device), batch_size, seeds, step)

    def counter_tables(self, device: torch.device) -> CounterTables:
        """What sample_counter reads on `device`, built there once: a trainer builds them
        before its first step, so the step reads device tensors only."""
        if device not in self._counter_tables:
            self._counter_tables[device] = CounterTables.of([self], device)
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


@dataclass(frozen=True)
class CounterTables:
    """What the counter sampler reads, on one device, for one task that every seed shares
    (a single row, K' = 1) or one task per seed (K' = K rows, each padded to the largest):
    the token layout's offsets, the inverse-CDF tables and the fact table."""

    seq_len: int  # T, shared
    n_subjects: torch.Tensor  # [K', 1] S: the first relation token
    first_noise: torch.Tensor  # [K', 1, 1] S + R: the first noise token
    n_noise: torch.Tensor  # [K', 1, 1] N
    eos: torch.Tensor  # [K', 1, 1] the EOS token, S + R + N
    subject_ticks: torch.Tensor  # [S] one task, [K, S_max] one per seed (padded with 2^32: never drawn)
    relation_ticks: torch.Tensor  # [R] or [K, R_max]
    facts: torch.Tensor  # [K', S_max * R_max] the answer of (s, r) at s * R_max + r
    n_relations_max: int  # R_max

    @classmethod
    def of(cls, tasks: Sequence[FactualRecallTask], device: torch.device) -> CounterTables:
        """The tables of one task (a single row) or of one task per seed, on `device`."""
        if len({t.seq_len for t in tasks}) > 1:
            raise ValueError(f"tasks drawn as one batch need one seq_len, got {sorted({t.seq_len for t in tasks})}.")
        S_max, R_max = max(t.n_subjects for t in tasks), max(t.n_relations for t in tasks)

        def column(values):  # [K', 1, 1]
            return torch.tensor(values, device=device).view(-1, 1, 1)

        def ticks(tables: list[torch.Tensor], n: int) -> torch.Tensor:
            if len(tables) == 1:
                return tables[0].to(device)
            return torch.stack([torch.cat([t, t.new_full((n - len(t),), 2 ** 32)]) for t in tables]).to(device)

        facts = torch.zeros(len(tasks), S_max, R_max, dtype=torch.long)
        for k, t in enumerate(tasks):
            facts[k, :t.n_subjects, :t.n_relations] = t.facts
        return cls(tasks[0].seq_len, column([t.n_subjects for t in tasks])[:, 0],
                   column([t.n_subjects + t.n_relations for t in tasks]), column([t.n_noise for t in tasks]),
                   column([t.eos for t in tasks]), ticks([t.subject_ticks for t in tasks], S_max),
                   ticks([t.relation_ticks for t in tasks], R_max), facts.flatten(1).to(device), R_max)


def counter_prompts(tables: CounterTables, batch_size: int, seeds: torch.Tensor, step: int | torch.Tensor,
                    kernel: bool | None = None) -> Batch:
    """Every seed's prompts [K, batch, ...] at `step` from counter-based values, each seed's at
    its own task's sizes (`tables`), in a fixed number of torch calls. Per prompt: T-1 noise
    values, then one each for the subject, the relation and the two positions; (s, r) by
    inverse CDF. Integer arithmetic only: a seed draws the same prompts alone, in a stack of
    any size or tasks, and on any device. `kernel`: draw them with one Triton kernel
    (tasks/counter_kernel.py, the same bits; default: on CUDA, where Triton compiles) instead
    of about ninety torch operations."""
    if kernel or (kernel is None and seeds.device.type == "cuda" and triton_kernels.runs_on(seeds.device)):
        return _kernel_prompts(tables, batch_size, seeds, step)
    K, B, T = len(seeds), batch_size, tables.seq_len
    values = counter.bits(seeds, step, B * (T + 3)).view(K, B, T + 3)  # [K, B, T+3]
    noise, picks = values.split([T - 1, 4], -1)  # [K, B, T-1], [K, B, 4]
    subjects = counter.inverse_cdf(picks[..., 0].contiguous(), tables.subject_ticks)  # [K, B]
    relations = counter.inverse_cdf(picks[..., 1].contiguous(), tables.relation_ticks)  # [K, B]
    subject_pos = counter.below(picks[..., 2], T - 1)  # [K, B]
    relation_pos = counter.below(picks[..., 3], T - 2)  # [K, B]
    relation_pos += (relation_pos >= subject_pos).long()  # distinct from subject_pos
    tokens = torch.cat([counter.below(noise, tables.n_noise) + tables.first_noise,
                        tables.eos.expand(K, B, 1)], -1)  # [K, B, T]
    relation_tokens = tables.n_subjects + relations  # [K, B]
    tokens.scatter_(-1, subject_pos[..., None], subjects[..., None])
    tokens.scatter_(-1, relation_pos[..., None], relation_tokens[..., None])
    answers = tables.facts.expand(K, -1).gather(-1, subjects * tables.n_relations_max + relations)  # [K, B]
    return Batch(tokens, subjects, relations, answers, subject_pos, relation_pos)


def _kernel_prompts(tables: CounterTables, batch_size: int, seeds: torch.Tensor, step: int | torch.Tensor) -> Batch:
    """counter_prompts as one launch of tasks.counter_kernel.prompts."""
    K, B, T = len(seeds), batch_size, tables.seq_len
    tokens = seeds.new_empty(K, B, T)  # [K, B, T]
    fields = [seeds.new_empty(K, B) for _ in range(5)]  # subjects, relations, answers, subject_pos, relation_pos
    if tables.n_subjects.shape[0] > 1:  # one row per seed, or (stride 0) one shared by all
        table_row, facts_row = 1, tables.facts.stride(0)
    else:
        table_row = facts_row = 0
    s_ticks, r_ticks = tables.subject_ticks, tables.relation_ticks
    pointer = isinstance(step, torch.Tensor)
    triton_kernels.load("tasks.counter_kernel").prompts[(-(-B // COUNTER_BLOCK_B), K)](
        seeds.contiguous(), step, tokens, *fields, tables.n_subjects, tables.first_noise, tables.n_noise, tables.eos,
        s_ticks, r_ticks, tables.facts, B, s_ticks.shape[-1], r_ticks.shape[-1], tables.n_relations_max,
        s_ticks.stride(0) if s_ticks.dim() == 2 else 0, r_ticks.stride(0) if r_ticks.dim() == 2 else 0,
        table_row, facts_row, T=T, STEP_IS_POINTER=pointer, BLOCK_B=COUNTER_BLOCK_B,
        BLOCK_T=1 << (T - 1).bit_length(), BLOCK_S=COUNTER_BLOCK_TICKS)
    subjects, relations, answers, subject_pos, relation_pos = fields
    return Batch(tokens, subjects, relations, answers, subject_pos, relation_pos)


class TaskStack:
    """K factual-recall tasks of one sequence length whose counter batches are drawn as one:
    row k of a batch is seed k's prompts at task k's S, R, N, Zipf frequencies and fact
    table, in task k's own token layout, bit-identical to task k's own sample_counter."""

    def __init__(self, tasks: Sequence[FactualRecallTask]):
        self.tasks = list(tasks)
        self._counter_tables: dict[torch.device, CounterTables] = {}

    def sample_counter(self, batch_size: int, seeds: torch.Tensor, step: int | torch.Tensor) -> Batch:
        """Seed k's prompts [K, batch, ...] on task k at `step` (seeds [K] int64, one per task)."""
        if len(seeds) != len(self.tasks):
            raise ValueError(f"a stack of {len(self.tasks)} tasks draws one seed each, got {len(seeds)} seeds.")
        return counter_prompts(self.counter_tables(seeds.device), batch_size, seeds, step)

    def counter_tables(self, device: torch.device) -> CounterTables:
        """What sample_counter reads on `device`, built there once (FactualRecallTask.counter_tables)."""
        if device not in self._counter_tables:
            self._counter_tables[device] = CounterTables.of(self.tasks, device)
        return self._counter_tables[device]
