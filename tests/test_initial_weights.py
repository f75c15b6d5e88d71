"""A seed draws the same initial weights as it always did (models.recall.weights.DRAW_ORDER and the
attention-only family's fixed order), so recorded sweeps re-run to the same numbers.

Each parameterisation's initial weights for one small config and seed are pinned by a sha256
of their float32 bytes, concatenated in sorted key order (each key's name before its bytes).
"""
import hashlib

import pytest
import torch

from models.aot.config import AoTModelConfig
from models.aot.weights import init_aot_weights
from models.recall.config import ModelConfig
from models.recall.weights import init_weights
from tasks.association import AssociationTask
from tasks.factual_recall import FactualRecallTask


def checksum(weights: dict[str, torch.Tensor]) -> str:
    """sha256 of the weights' float32 bytes in sorted key order."""
    h = hashlib.sha256()
    for key in sorted(weights):
        h.update(key.encode())
        h.update(weights[key].to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("parameterisation, expected", [
    ("standard", "64c5e609fb710211847a0df808faa26bc1ab7d34339fc0f0447e68da80cd6d8a"),
    ("authors", "cb45620dd070a3d20d37658fb02e8291b0900a44af02141d41c7ca5f020a0327"),
])
def test_factual_recall_initial_weights_are_pinned(parameterisation, expected):
    cfg = ModelConfig(d_model=8, n_heads=2, d_head=4, d_mlp=16, parameterisation=parameterisation)
    assert checksum(init_weights(cfg, FactualRecallTask(12, 4, 3, 10, 9), seed=3)) == expected


@pytest.mark.parametrize("head_layout, expected", [
    ("standard", "fce87bc4d31c5ccd526d257992bbee10739ce2aec53aec43997882654e2bb284"),
    ("dana", "f66ff3f59954a4e16046c5c2f4b82dcec23a9349ae155df14d4c9d566bb67906"),
])
def test_attention_only_family_initial_weights_are_pinned(head_layout, expected):
    cfg = AoTModelConfig(d_model=4, n_heads=2, d_head=3, d_mlp=6, head_layout=head_layout)
    assert checksum(init_aot_weights(cfg, AssociationTask(n_tokens=5, context=3), seed=3)) == expected
