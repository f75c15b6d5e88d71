import pytest
import torch

from models.config import RunConfig, override, preset
from models.trainer import train


def quick(run: RunConfig, **train_overrides) -> RunConfig:
    """`run` on the CPU without progress bars, with training fields replaced."""
    return RunConfig(run.task, run.model, override(run.train, {"device": "cpu", **train_overrides}))


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
