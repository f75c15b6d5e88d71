"""The trainers' fast forward and its attention cores (no family's code: a family calls them):

  forward.py          last-position logits of K stacked one-layer models; the vocabulary core
                      (`VocabAttention`) and the choice of core (`CORES`, `choose_core`)
  deep.py             the same for L-layer models: the last layer at the last position only
  fused_attention.py  the fused core: three Triton kernels that never write [K, H, B, V]
  fused_kernels.py    those kernels

Each is pinned to the TransformerLens model by a parity test (tests/test_parity.py,
tests/test_fused_attention.py, tests/test_depth.py).
"""
