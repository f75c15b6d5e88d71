"""The fused attention core's three Triton kernels (models.cores.fused_attention launches them; it
imports this module on first use, after deciding whether Triton compiles or interprets)."""
import triton
import triton.language as tl


@triton.jit
def forward(q, key, value, index, score_pos, z, pattern, B, T,
            sq_k, sq_h, sq_e, sq_b, skey_k, skey_h, skey_e, skey_v, sval_k, sval_h, sval_e, sval_v,
            si_k, si_h, si_b, si_t, ss_k, ss_h, ss_b, ss_t, sz_k, sz_h, sz_e, sz_b, sp_k, sp_h, sp_b, sp_t,
            E: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_T: tl.constexpr,
            POSITIONAL: tl.constexpr, LINEAR: tl.constexpr):
    """One (block of prompts, head, model): scores of the last query against the prompt's
    tokens, the pattern over positions, the value mix z."""
    k, h = tl.program_id(2), tl.program_id(1)
    b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)  # [BB]
    t = tl.arange(0, BLOCK_T)  # [BT]
    row, col = b < B, t < T
    inside = row[:, None] & col[None, :]  # [BB, BT]
    tokens = tl.load(index + k * si_k + h * si_h + b[:, None] * si_b + t[None, :] * si_t, mask=inside,
                     other=0).to(tl.int32)  # 32-bit offsets: entries < V
    q_at = q + k * sq_k + h * sq_h + b * sq_b
    key_at = key + k * skey_k + h * skey_h + tokens * skey_v
    scores = tl.zeros([BLOCK_B, BLOCK_T], dtype=q.dtype.element_ty)
    for e in tl.static_range(E):
        q_e = tl.load(q_at + e * sq_e, mask=row, other=0.0)  # [BB]
        scores += q_e[:, None] * tl.load(key_at + e * skey_e, mask=inside, other=0.0)  # [BB, BT]
    if POSITIONAL:
        scores += tl.load(score_pos + k * ss_k + h * ss_h + b[:, None] * ss_b + t[None, :] * ss_t,
                          mask=inside, other=0.0)
    if LINEAR:
        p = scores
    else:
        scores = tl.where(col[None, :], scores, float("-inf"))
        weights = tl.exp(scores - tl.max(scores, axis=1)[:, None])
        p = weights / tl.sum(weights, axis=1)[:, None]  # [BB, BT]
    tl.store(pattern + k * sp_k + h * sp_h + b[:, None] * sp_b + t[None, :] * sp_t, p, mask=inside)
    value_at = value + k * sval_k + h * sval_h + tokens * sval_v
    z_at = z + k * sz_k + h * sz_h + b * sz_b
    for e in tl.static_range(E):
        v_e = tl.load(value_at + e * sval_e, mask=inside, other=0.0)  # [BB, BT]
        tl.store(z_at + e * sz_e, tl.sum(p * v_e, axis=1), mask=row)

@triton.jit
def backward(q, key, value, index, pattern, d_z, d_pattern, d_q, d_scores, B, T,
             sq_k, sq_h, sq_e, sq_b, skey_k, skey_h, skey_e, skey_v, sval_k, sval_h, sval_e, sval_v,
             si_k, si_h, si_b, si_t, sp_k, sp_h, sp_b, sp_t, sz_k, sz_h, sz_e, sz_b, sd_k, sd_h, sd_b, sd_t,
             E: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_T: tl.constexpr,
             HAS_DPATTERN: tl.constexpr, LINEAR: tl.constexpr):
    """One (block of prompts, head, model): the pattern's gradient from z's, the scores'
    gradient through the softmax (written to d_scores) and the query's gradient. d_q and d_z
    have q's strides (sq_*, sz_*: both passed), d_pattern and d_scores one layout (sd_*)."""
    k, h = tl.program_id(2), tl.program_id(1)
    b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)  # [BB]
    t = tl.arange(0, BLOCK_T)  # [BT]
    row, col = b < B, t < T
    inside = row[:, None] & col[None, :]  # [BB, BT]
    tokens = tl.load(index + k * si_k + h * si_h + b[:, None] * si_b + t[None, :] * si_t, mask=inside,
                     other=0).to(tl.int32)  # 32-bit offsets: entries < V
    p = tl.load(pattern + k * sp_k + h * sp_h + b[:, None] * sp_b + t[None, :] * sp_t, mask=inside, other=0.0)
    dp = tl.zeros([BLOCK_B, BLOCK_T], dtype=p.dtype)
    d_z_at = d_z + k * sz_k + h * sz_h + b * sz_b
    value_at = value + k * sval_k + h * sval_h + tokens * sval_v
    for e in tl.static_range(E):
        d_z_e = tl.load(d_z_at + e * sz_e, mask=row, other=0.0)  # [BB]
        dp += d_z_e[:, None] * tl.load(value_at + e * sval_e, mask=inside, other=0.0)
    pattern_at = k * sd_k + h * sd_h + b[:, None] * sd_b + t[None, :] * sd_t
    if HAS_DPATTERN:
        dp += tl.load(d_pattern + pattern_at, mask=inside, other=0.0)
    if LINEAR:
        ds = dp
    else:
        ds = p * (dp - tl.sum(p * dp, axis=1)[:, None])  # [BB, BT]
    tl.store(d_scores + pattern_at, ds, mask=inside)
    d_q_at = d_q + k * sz_k + h * sz_h + b * sz_b
    key_at = key + k * skey_k + h * skey_h + tokens * skey_v
    for e in tl.static_range(E):
        k_e = tl.load(key_at + e * skey_e, mask=inside, other=0.0)  # [BB, BT]
        tl.store(d_q_at + e * sz_e, tl.sum(ds * k_e, axis=1), mask=row)


@triton.jit
def tables(q, order, starts, pattern, d_z, d_scores, d_key, d_value, T,
           sq_k, sq_h, sq_e, sq_b, so_k, so_h, ss_k, ss_h, sp_k, sp_h, sp_b, sp_t, sz_k, sz_h, sz_e, sz_b,
           sd_k, sd_h, sd_b, sd_t, sg_k, sg_h, sg_e, sg_v,
           E: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_N: tl.constexpr):
    """One (vocabulary entry v, head, model): the key and value tables' gradients at v,
    summed over the positions that hold v, in blocks of BLOCK_N, in registers, and stored once
    (no atomic add: the sums run in one fixed order). `order` lists each model's positions
    (b * T + t) sorted by token, `starts[v] : starts[v + 1]` those holding v, so a program
    reads only its own positions:
        d_value[:, v] = sum over them of pattern[b, t] d_z[:, b],  d_key[:, v] = ... d_scores[b, t] q[:, b].
    d_key and d_value share strides (sg_*)."""
    v, h, k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    first = tl.load(starts + k * ss_k + h * ss_h + v)
    last = tl.load(starts + k * ss_k + h * ss_h + v + 1)
    e = tl.arange(0, BLOCK_E)  # [BE]
    heads = e < E
    d_key_acc = tl.zeros([BLOCK_E, BLOCK_N], dtype=q.dtype.element_ty)  # [BE, BN]
    d_value_acc = tl.zeros([BLOCK_E, BLOCK_N], dtype=q.dtype.element_ty)
    for start in range(first, last, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)  # [BN]
        live = n < last
        position = tl.load(order + k * so_k + h * so_h + n, mask=live, other=0).to(tl.int32)  # < B * T
        b, t = position // T, position % T  # [BN]
        p = tl.load(pattern + k * sp_k + h * sp_h + b * sp_b + t * sp_t, mask=live, other=0.0)  # [BN]
        ds = tl.load(d_scores + k * sd_k + h * sd_h + b * sd_b + t * sd_t, mask=live, other=0.0)
        both = heads[:, None] & live[None, :]  # [BE, BN]
        q_n = tl.load(q + k * sq_k + h * sq_h + e[:, None] * sq_e + b[None, :] * sq_b, mask=both, other=0.0)
        d_z_n = tl.load(d_z + k * sz_k + h * sz_h + e[:, None] * sz_e + b[None, :] * sz_b, mask=both, other=0.0)
        d_key_acc += q_n * ds[None, :]
        d_value_acc += d_z_n * p[None, :]
    out = k * sg_k + h * sg_h + e * sg_e + v * sg_v  # [BE]
    tl.store(d_key + out, tl.sum(d_key_acc, axis=1), mask=heads)
    tl.store(d_value + out, tl.sum(d_value_acc, axis=1), mask=heads)
