import os

import pytest
import torch

from models.cli import override
from models.recall.config import RunConfig
from models.recall.presets import preset
from models.recall.trainer import train

# The device the parity tests and the trained fixtures compute on: the CPU, or a GPU with
# FACTUAL_RECALL_TEST_DEVICE=cuda (docs/gpu.md). TF32 off, so float32 is float32.
TEST_DEVICE = torch.device(os.environ.get("FACTUAL_RECALL_TEST_DEVICE", "cpu"))
if TEST_DEVICE.type == "cuda":
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def quick(run: RunConfig, **train_overrides) -> RunConfig:
    """`run` on TEST_DEVICE, with training fields replaced."""
    return RunConfig(run.task, run.model, override(run.train, {"device": str(TEST_DEVICE), **train_overrides}))


@pytest.fixture(scope="session")
def tiny_result():
    """The tiny preset trained once for the whole session."""
    return train(quick(preset("tiny")), progress=False, preset_name="tiny")


@pytest.fixture(scope="session")
def tiny_ckpt(tiny_result, tmp_path_factory):
    return tiny_result.save(tmp_path_factory.mktemp("ckpt") / "tiny")


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)
