"""What is measured: configs and presets, TransformerLens models, training, checkpoints."""
from models.bridge import build_bridge, load, resolve_device
from models.checkpoint import Checkpoint, CheckpointError, load_checkpoint
from models.config import ModelConfig, RunConfig, TaskConfig, TrainConfig, preset

__all__ = ["build_bridge", "load", "resolve_device", "Checkpoint", "CheckpointError",
           "load_checkpoint", "ModelConfig", "RunConfig", "TaskConfig", "TrainConfig", "preset"]
