"""Two-hop recall: the factual-recall task whose relations map entities to entities, so that
an answer is itself a subject and two relations compose (Biran et al. 2024; Wang et al. 2024).

A one-hop prompt hides an entity s and one relation token among noise and asks for r(s); a
two-hop prompt hides s, a first relation r1 and a second relation r2 and asks for r2(r1(s)),
through the bridge entity b = r1(s). The relations' order is read from the tokens, not the
positions: every relation has two tokens, one of the first set (r1) and one of the second
(r2), and a two-hop prompt holds one of each, at random distinct positions among the first
T-1. A one-hop prompt's relation token is of either set with equal odds, so both tokens of
a relation are taught as one-hop facts. A share `held_out_fraction` of the compositions
(s, r1, r2) is never drawn as a two-hop prompt in training, while every one-hop fact is:
these measure whether the model composes or memorises. Token layout (docs/checkpoint_format.md):

    inputs   0..S-1 entities | S..S+R-1 first relations | S+R..S+2R-1 second relations
             | S+2R..S+2R+N-1 noise | S+2R+N EOS
    outputs  0..S-1 entities (E<e>): output id e is input id e's entity
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from tasks import counter

MODES = ("mixed", "one_hop", "two_hop", "held_out")  # what a prompt set draws (the training data is `mixed`)
N_VALUES_EXTRA = 5  # counter values per prompt beyond the T-1 noise ones: hops, the pick, three positions


def vocab_sizes(n_subjects: int, n_relations: int, n_noise: int) -> tuple[int, int]:
    """(input ids, output ids): S entities, R first-hop and R second-hop relation tokens, N noise
    and EOS in; the S entities out."""
    return n_subjects + 2 * n_relations + n_noise + 1, n_subjects


@dataclass(frozen=True)
class TwoHopBatch:
    """Prompts and targets (a leading model axis [K, ...] on every field from sample_counter)."""

    tokens: torch.Tensor  # [batch, T] input ids, EOS last
    subjects: torch.Tensor  # [batch] entity s
    relations: torch.Tensor  # [batch, 2] r1 and r2 (r2 = -1 in a one-hop prompt)
    bridges: torch.Tensor  # [batch] r1(s) in a two-hop prompt, -1 in a one-hop one
    answers: torch.Tensor  # [batch] output id: r2(r1(s)), or r(s)
    hops: torch.Tensor  # [batch] 1 or 2
    positions: torch.Tensor  # [batch, 3] positions of s, r1 (or r), r2 (a noise position in a one-hop prompt)

    def __len__(self) -> int:
        return self.tokens.shape[-2]

    def to(self, device) -> TwoHopBatch:
        return TwoHopBatch(*(getattr(self, f.name).to(device) for f in fields(self)))


class TwoHopTask:
    """S entities, R relations (entity -> entity), N noise tokens, length T; a share
    `one_hop_share` of the training prompts is one-hop. `facts` is "random" (r(s) uniform over
    the entities, from `fact_seed`) or an S x R table of entity ids; `held_out` the held-out
    compositions as triples (s, r1, r2), or None: a share `held_out_fraction` of all S R^2,
    drawn from `fact_seed`."""

    kind = "two_hop"
    hops = 2

    def __init__(self, n_subjects: int, n_relations: int, n_noise: int, seq_len: int,
                 held_out_fraction: float = 0.2, one_hop_share: float = 0.5, facts="random",
                 fact_seed: int = 0, held_out=None):
        S, R, N, T = n_subjects, n_relations, n_noise, seq_len
        for name, value, low in [("n_subjects", S, 2), ("n_relations", R, 1), ("n_noise", N, 1), ("seq_len", T, 4)]:
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low} for two-hop prompts, got {value!r}.")
        for name, share in [("held_out_fraction", held_out_fraction), ("one_hop_share", one_hop_share)]:
            if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share < 1:
                raise ValueError(f"{name} must be a number in [0, 1), got {share!r}.")
        self.n_subjects, self.n_relations, self.n_noise, self.seq_len = S, R, N, T
        self.one_hop_share, self.fact_seed = float(one_hop_share), fact_seed
        self.facts = self._make_facts(facts, fact_seed)  # [S, R] entity ids
        n = S * R * R
        if held_out is None:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(fact_seed + 1))
            held = order[:round(held_out_fraction * n)].sort().values
        else:
            held = self._triples(held_out)
        mask = torch.zeros(n, dtype=torch.bool)
        mask[held] = True
        if mask.all():
            raise ValueError("every composition is held out: no two-hop prompt is left to train on.")
        self.held_out = held  # [n_held] triple ids s*R*R + r1*R + r2, sorted
        self.trained = (~mask).nonzero()[:, 0]  # [n_train] the compositions training draws
        self.held_out_fraction = len(held) / n
        self._device_tables: dict[torch.device, tuple[torch.Tensor, ...]] = {}

    # ----------------------------------------------------------------- vocabulary
    @property
    def d_vocab(self) -> int:
        return vocab_sizes(self.n_subjects, self.n_relations, self.n_noise)[0]

    @property
    def d_vocab_out(self) -> int:
        return vocab_sizes(self.n_subjects, self.n_relations, self.n_noise)[1]

    @property
    def eos(self) -> int:
        return self.d_vocab - 1

    @property
    def n_facts(self) -> int:
        return self.n_subjects * self.n_relations

    def relation_token(self, r, hop: int = 1):
        """The input id of relation r's token of the first (hop 1) or the second (hop 2) set."""
        return self.n_subjects + (hop - 1) * self.n_relations + r

    def token_label(self, token: int) -> str:
        """S3 (entity), R1 (first-set relation), R1' (second-set), n5, EOS."""
        S, R = self.n_subjects, self.n_relations
        if token < S:
            return f"S{token}"
        if token < S + 2 * R:
            return f"R{token - S}" if token < S + R else f"R{token - S - R}'"
        return f"n{token - S - 2 * R}" if token < self.eos else "EOS"

    def answer_label(self, answer: int) -> str:
        if not 0 <= answer < self.d_vocab_out:
            raise ValueError(f"answer id {answer} is outside the task's answers 0..{self.d_vocab_out - 1}.")
        return f"E{int(answer)}"

    def composition(self, triples: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(s, r1, r2, bridge r1(s), answer r2(r1(s))) of triple ids [n]: five [n] tensors."""
        R = self.n_relations
        s, r1, r2 = triples // (R * R), triples // R % R, triples % R
        bridge = self.facts[s, r1]
        return s, r1, r2, bridge, self.facts[bridge, r2]

    # ---------------------------------------------------------------- sampling
    def prompts(self, values: torch.Tensor, mode: str = "mixed") -> TwoHopBatch:
        """Prompts [..., B] from uniform 32-bit values [..., B, T-1+5] (int64): T-1 noise values,
        then whether the prompt is one-hop (below one_hop_share), which fact or composition, and
        three distinct positions. `mode`: MODES (held_out draws from the held-out compositions)."""
        S, R, T = self.n_subjects, self.n_relations, self.seq_len
        facts, trained, held = self._tables(values.device)
        noise, pick = values[..., :T - 1], values[..., T - 1:]
        one_hop = {"mixed": pick[..., 0] < round(self.one_hop_share * 2 ** 32), "one_hop": True,
                   "two_hop": False, "held_out": False}[mode]
        one_hop = torch.as_tensor(one_hop, device=values.device).expand(pick.shape[:-1])  # [..., B]
        pool = held if mode == "held_out" else trained
        if len(pool) == 0:
            raise ValueError("the task holds out no composition: no held-out prompt to draw.")
        triple = pool[counter.below(pick[..., 1], len(pool))]  # [..., B]
        single = counter.below(pick[..., 1], 2 * S * R)  # [..., B] (second set, s, r)
        s = torch.where(one_hop, single % (S * R) // R, triple // (R * R))
        r1 = torch.where(one_hop, single % R, triple // R % R)
        r2 = torch.where(one_hop, -1, triple % R)
        bridge = facts[s * R + r1]
        answer = torch.where(one_hop, bridge, facts[bridge * R + r2.clamp(min=0)])
        a = counter.below(pick[..., 2], T - 1)
        b = counter.below(pick[..., 3], T - 2)
        b += (b >= a).long()
        lo, hi = torch.minimum(a, b), torch.maximum(a, b)
        c = counter.below(pick[..., 4], T - 3)
        c += (c >= lo).long()
        c += (c >= hi).long()
        tokens = torch.cat([counter.below(noise, self.n_noise) + S + 2 * R,
                            torch.full_like(noise[..., :1], self.eos)], -1)  # [..., B, T]
        first = S + r1 + torch.where(one_hop, single // (S * R) * R, 0)  # a one-hop prompt's set is drawn
        tokens.scatter_(-1, a[..., None], s[..., None])
        tokens.scatter_(-1, b[..., None], first[..., None])
        kept = tokens.gather(-1, c[..., None])[..., 0]  # a one-hop prompt keeps its noise there
        tokens.scatter_(-1, c[..., None], torch.where(one_hop, kept, S + R + r2)[..., None])
        return TwoHopBatch(tokens, s, torch.stack([r1, r2], -1), torch.where(one_hop, -1, bridge), answer,
                           torch.where(one_hop, 1, 2), torch.stack([a, b, c], -1))

    def sample(self, batch_size: int, generator: torch.Generator, mode: str = "mixed") -> TwoHopBatch:
        """Fresh prompts on the generator's device (the training data's `generator` sampler)."""
        values = torch.randint(0, 2 ** 32, (batch_size, self.seq_len - 1 + N_VALUES_EXTRA), generator=generator,
                               device=generator.device)
        return self.prompts(values, mode)

    def sample_counter(self, batch_size: int, seeds: torch.Tensor, step) -> TwoHopBatch:
        """Every seed's [K] prompts [K, batch, ...] at `step`, a function of seed and step alone."""
        n = self.seq_len - 1 + N_VALUES_EXTRA
        return self.prompts(counter.bits(seeds, step, batch_size * n).view(len(seeds), batch_size, n))

    def counter_tables(self, device: torch.device):
        """The tables sample_counter reads, put on `device` before the first step."""
        return self._tables(device)

    def eval_set(self, n: int, seed: int = 1234, device="cpu", mode: str = "mixed") -> TwoHopBatch:
        """The same `n` prompts of `mode` for every call with this seed, drawn on the CPU."""
        return self.sample(n, torch.Generator().manual_seed(seed), mode).to(device)

    def eval_sets(self, n: int, seed: int = 1234, device="cpu") -> dict[str, TwoHopBatch]:
        """What training records beside its held-out accuracy: one-hop prompts, two-hop prompts
        of trained compositions and of held-out ones (none when no composition is held out)."""
        modes = ("one_hop", "two_hop") + (("held_out",) if len(self.held_out) else ())
        return {mode: self.eval_set(n, seed + i, device, mode) for i, mode in enumerate(modes)}

    # ------------------------------------------------------------- (de)serialise
    def to_config(self) -> dict:
        R = self.n_relations
        return {"kind": self.kind, "hops": self.hops, "n_subjects": self.n_subjects, "n_relations": R,
                "n_noise": self.n_noise, "seq_len": self.seq_len, "one_hop_share": self.one_hop_share,
                "held_out_fraction": self.held_out_fraction, "facts": self.facts.tolist(),
                "held_out": [[t // (R * R), t // R % R, t % R] for t in self.held_out.tolist()]}

    @classmethod
    def from_config(cls, cfg: dict) -> TwoHopTask:
        missing = [k for k in ("n_subjects", "n_relations", "n_noise", "seq_len", "facts", "held_out") if k not in cfg]
        if missing:
            raise ValueError(f"task section lacks {', '.join(missing)}.")
        if cfg.get("hops", 2) != 2:
            raise ValueError(f"a two-hop task section has hops 2, got {cfg['hops']!r}.")
        return cls(cfg["n_subjects"], cfg["n_relations"], cfg["n_noise"], cfg["seq_len"],
                   one_hop_share=cfg.get("one_hop_share", 0.5), facts=cfg["facts"], held_out=cfg["held_out"])

    def __repr__(self) -> str:
        return (f"TwoHopTask(S={self.n_subjects}, R={self.n_relations}, N={self.n_noise}, T={self.seq_len}, "
                f"held out {len(self.held_out)} of {self.n_subjects * self.n_relations ** 2} compositions)")

    # ---------------------------------------------------------------- internals
    def _make_facts(self, facts, fact_seed: int) -> torch.Tensor:
        S, R = self.n_subjects, self.n_relations
        if isinstance(facts, str):
            if facts != "random":
                raise ValueError(f"two-hop facts must be 'random' or an S x R table of entity ids, got {facts!r}.")
            return torch.randint(0, S, (S, R), generator=torch.Generator().manual_seed(fact_seed))
        table = torch.as_tensor(facts)
        if table.shape != (S, R) or table.is_floating_point() or ((table < 0) | (table >= S)).any():
            raise ValueError(f"facts must be an S x R = {S} x {R} table of entity ids 0..{S - 1}.")
        return table.long()

    def _triples(self, triples) -> torch.Tensor:
        S, R = self.n_subjects, self.n_relations
        table = torch.as_tensor(triples, dtype=torch.long).view(-1, 3)
        if ((table < 0) | (table >= torch.tensor([S, R, R]))).any():
            raise ValueError(f"held-out compositions must be (s, r1, r2) with s < {S}, r < {R}.")
        return (table[:, 0] * R * R + table[:, 1] * R + table[:, 2]).unique()

    def _tables(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """Facts (flat [S*R]), trained and held-out compositions on `device`, copied there once."""
        device = torch.device(device)
        if device not in self._device_tables:
            self._device_tables[device] = (self.facts.flatten().to(device), self.trained.to(device),
                                           self.held_out.to(device))
        return self._device_tables[device]
