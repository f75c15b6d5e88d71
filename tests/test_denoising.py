"""Attention-denoising scores, the head-token table and specialisation, measured on constructions whose attention is known."""
