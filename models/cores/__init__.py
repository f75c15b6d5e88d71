"""The attention cores of the trainers' fast forward and their Triton kernels."""
