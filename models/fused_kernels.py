"""The fused attention core's two Triton kernels (models.fused_attention launches them; it
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
    tokens = tl.load(index + k * si_k + h * si_h + b[:, None] * si_b + t[None, :] * si_t, mask=inside, other=0)
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
def backward(q, key, value, index, pattern, d_z, d_pattern, d_q, d_key, d_value, d_scores, B, T,
             sq_k, sq_h, sq_e, sq_b, skey_k, skey_h, skey_e, skey_v, sval_k, sval_h, sval_e, sval_v,
             si_k, si_h, si_b, si_t, sp_k, sp_h, sp_b, sp_t, sz_k, sz_h, sz_e, sz_b,
             sd_k, sd_h, sd_b, sd_t, sg_k, sg_h, sg_e, sg_v,
             E: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_T: tl.constexpr,
             HAS_DPATTERN: tl.constexpr, POSITIONAL: tl.constexpr,
             LINEAR: tl.constexpr):
    """One (block of prompts, head, model): the pattern's gradient from z's, the scores'
    gradient through the softmax, the query's gradient, and the key and value tables'
    gradients added into their entries. d_q and d_z have q's strides (sq_*, sz_*: both
    passed), d_pattern and d_scores one layout (sd_*), d_key and d_value one (sg_*)."""
    k, h = tl.program_id(2), tl.program_id(1)
    b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)  # [BB]
    t = tl.arange(0, BLOCK_T)  # [BT]
    row, col = b < B, t < T
    inside = row[:, None] & col[None, :]  # [BB, BT]
    tokens = tl.load(index + k * si_k + h * si_h + b[:, None] * si_b + t[None, :] * si_t, mask=inside, other=0)
    p = tl.load(pattern + k * sp_k + h * sp_h + b[:, None] * sp_b + t[None, :] * sp_t, mask=inside, other=0.0)
    grad_at = k * sg_k + h * sg_h + tokens * sg_v  # [BB, BT] entries of the table gradients
    dp = tl.zeros([BLOCK_B, BLOCK_T], dtype=p.dtype)
    d_z_at = d_z + k * sz_k + h * sz_h + b * sz_b
    value_at = value + k * sval_k + h * sval_h + tokens * sval_v
    for e in tl.static_range(E):
        d_z_e = tl.load(d_z_at + e * sz_e, mask=row, other=0.0)  # [BB]
        dp += d_z_e[:, None] * tl.load(value_at + e * sval_e, mask=inside, other=0.0)
        tl.atomic_add(d_value + grad_at + e * sg_e, d_z_e[:, None] * p, mask=inside)
    pattern_at = k * sd_k + h * sd_h + b[:, None] * sd_b + t[None, :] * sd_t
    if HAS_DPATTERN:
        dp += tl.load(d_pattern + pattern_at, mask=inside, other=0.0)
    if LINEAR:
        ds = dp
    else:
        ds = p * (dp - tl.sum(p * dp, axis=1)[:, None])  # [BB, BT]
    if POSITIONAL:
        tl.store(d_scores + pattern_at, ds, mask=inside)
    q_at = q + k * sq_k + h * sq_h + b * sq_b
    d_q_at = d_q + k * sz_k + h * sz_h + b * sz_b
    key_at = key + k * skey_k + h * skey_h + tokens * skey_v
    for e in tl.static_range(E):
        k_e = tl.load(key_at + e * skey_e, mask=inside, other=0.0)  # [BB, BT]
        tl.store(d_q_at + e * sz_e, tl.sum(ds * k_e, axis=1), mask=row)
        q_e = tl.load(q_at + e * sq_e, mask=row, other=0.0)  # [BB]
        tl.atomic_add(d_key + grad_at + e * sg_e, q_e[:, None] * ds, mask=inside)
