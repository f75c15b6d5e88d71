"""The counter sampler's whole batch as one Triton kernel (tasks.counter_sampler.counter_prompts
launches it on CUDA): the hash of tasks/counter.py, the inverse CDFs, the positions and the
answers, for a block of prompts of one seed per program, in the same int64 arithmetic as
the torch form, so the two draw the same bits (tests/test_counter.py, in Triton's interpreter)."""
import triton
import triton.language as tl

MASK = tl.constexpr(0xFFFFFFFF)  # 2^32 - 1 (tasks.counter)
GOLDEN = tl.constexpr(0x9E3779B9)


@triton.jit
def mix32(x):
    """tasks.counter.mix32 on int64 values below 2^32."""
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & MASK
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & MASK
    return x ^ (x >> 15)


@triton.jit
def value(i, key1, key2):
    """Value i of a seed whose keys are key1, key2 (tasks.counter.bits)."""
    return mix32(mix32(i ^ key1) ^ key2)


@triton.jit
def inverse_cdf(v, ticks, n, BLOCK: tl.constexpr):
    """tasks.counter.inverse_cdf of values v [BB] in a row of n thresholds: how many are <= v."""
    drawn = tl.zeros(v.shape, dtype=tl.int64)
    for start in range(0, n, BLOCK):
        j = start + tl.arange(0, BLOCK)
        row = tl.load(ticks + j, mask=j < n, other=1 << 32)  # [BLOCK], padding never drawn
        drawn += tl.sum((row[None, :] <= v[:, None]).to(tl.int64), axis=1)
    return drawn


@triton.jit
def prompts(seeds, step, tokens, subjects, relations, answers, subject_pos, relation_pos,
            n_subjects, first_noise, n_noise, eos, subject_ticks, relation_ticks, facts,
            B, n_s, n_r, R_max, s_row, r_row, table_row, facts_row,
            T: tl.constexpr, STEP_IS_POINTER: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_T: tl.constexpr,
            BLOCK_S: tl.constexpr):
    """One (block of prompts, seed): seed k's prompts b at `step` (a pointer to one int64 or a
    value), written as tasks.counter_sampler.counter_prompts writes them (outputs contiguous,
    [K, B, T] and [K, B]). Each table row is seed k's (its *_row stride) or, stride 0, shared."""
    k = tl.program_id(1)
    b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)  # [BB]
    row = b < B
    seed = tl.load(seeds + k)
    now = tl.load(step) if STEP_IS_POINTER else step
    key1 = mix32(mix32(mix32(seed & MASK) ^ ((seed >> 32) & MASK)) ^ now)
    key2 = mix32(key1 ^ GOLDEN)
    first = b.to(tl.int64) * (T + 3)  # [BB] index of the prompt's first value
    drawn_s = inverse_cdf(value(first + T - 1, key1, key2), subject_ticks + k * s_row, n_s, BLOCK_S)
    drawn_r = inverse_cdf(value(first + T, key1, key2), relation_ticks + k * r_row, n_r, BLOCK_S)
    pos_s = (value(first + T + 1, key1, key2) * (T - 1)) >> 32
    pos_r = (value(first + T + 2, key1, key2) * (T - 2)) >> 32
    pos_r += (pos_r >= pos_s).to(tl.int64)
    c = tl.arange(0, BLOCK_T)  # [BT] positions
    noise = (value(first[:, None] + c[None, :], key1, key2) * tl.load(n_noise + k * table_row)) >> 32  # [BB, BT]
    words = noise + tl.load(first_noise + k * table_row)
    words = tl.where(c[None, :] == T - 1, tl.load(eos + k * table_row), words)
    words = tl.where(c[None, :] == pos_s[:, None], drawn_s[:, None], words)
    words = tl.where(c[None, :] == pos_r[:, None], tl.load(n_subjects + k * table_row) + drawn_r[:, None], words)
    at = k * B + b  # [BB]
    tl.store(tokens + at[:, None] * T + c[None, :], words, mask=row[:, None] & (c[None, :] < T))
    tl.store(subjects + at, drawn_s, mask=row)
    tl.store(relations + at, drawn_r, mask=row)
    tl.store(answers + at, tl.load(facts + k * facts_row + drawn_s * R_max + drawn_r, mask=row, other=0), mask=row)
    tl.store(subject_pos + at, pos_s, mask=row)
    tl.store(relation_pos + at, pos_r, mask=row)
