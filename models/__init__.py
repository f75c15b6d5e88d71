"""The models of both families, factual recall and attention-only memorisation (Dana et
al., the `aot_` files), one file per job:

  config.py, presets.py            what a model is: frozen configs, the factual-recall presets
  section.py                       what a checkpoint says a model is: the config.json `model`
                                   section (ModelSection), which shapes, counts and the bridge read
  weights.py, aot_weights.py       its weights: shapes, initialisation (the dana head layout and
                                   its TransformerLens form), stacks of K models
  forward.py, aot_forward.py       the trainers' fast forwards, each pinned to the TransformerLens
                                   model by a parity test
  trainer.py, aot_trainer.py       training K models at once -> TrainResult (optimizer.py: their
                                   Adam; shape_trainer.py: runs of different shapes as one stack)
  checkpoint.py                    saving and reading checkpoints of every task kind
  bridge.py                        the TransformerLens model (TransformerBridge), and `load`:
                                   checkpoint -> (model, task) for either family
"""
from models.bridge import build_bridge, load, resolve_device
from models.checkpoint import Checkpoint, CheckpointError, load_checkpoint, read_config
from models.config import AoTModelConfig, AoTTrainConfig, ModelConfig, RunConfig, TaskConfig, TrainConfig, preset
from models.section import ModelSection

__all__ = ["build_bridge", "load", "resolve_device", "Checkpoint", "CheckpointError", "load_checkpoint",
           "read_config", "AoTModelConfig", "AoTTrainConfig", "ModelConfig", "RunConfig", "TaskConfig",
           "TrainConfig", "preset", "ModelSection"]
