"""The factual-recall task's counter sampler: every seed's prompts at a step from counter-based
values (tasks/counter.py: a hash of seed, step and index), in integer arithmetic only, so a
seed draws the same prompts alone, in a stack of any size or tasks, and on any device; on
CUDA one Triton kernel (tasks/counter_kernel.py) draws the same bits.

`CounterTables` holds what it reads on a device (one task, or one task per seed),
`counter_prompts` draws, `TaskStack` draws K tasks' batches as one
(FactualRecallTask.sample_counter is one task's). It reads a task through `CounterTask` (what
every FactualRecallTask has), so it needs no import of tasks/factual_recall.py, which imports it.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from tasks import counter, triton_kernels
from tasks.batch import Batch

COUNTER_BLOCK_B, COUNTER_BLOCK_TICKS = 32, 64  # the counter sampler's kernel: prompts per program, thresholds per pass


class CounterTask(Protocol):
    """What the counter sampler reads of a factual-recall task (tasks.factual_recall.FactualRecallTask)."""

    seq_len: int  # T
    n_subjects: int  # S
    n_relations: int  # R
    n_noise: int  # N
    eos: int  # the EOS token, S + R + N
    subject_ticks: torch.Tensor  # [S] inverse CDF of the subjects, units of 2^-32
    relation_ticks: torch.Tensor  # [R]
    facts: torch.Tensor  # [S, R] answer ids


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
    def of(cls, tasks: Sequence[CounterTask], device: torch.device) -> CounterTables:
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

    def __init__(self, tasks: Sequence[CounterTask]):
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
