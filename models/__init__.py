"""The models of both families, one file per job: factual recall here, attention-only
memorisation (Dana et al.) in models/aot/ (its config, weights, forward and trainer), and the
pieces both share here:

  config.py, presets.py            what a factual-recall model is: frozen configs, the named
                                   presets and `preset`
  section.py                       what a checkpoint says a model is (either family): the
                                   config.json `model` section (ModelSection), which shapes,
                                   counts and the bridge read
  weights.py                       its weights: shapes, initialisation, stacks of K models
  forward.py                       the trainer's fast forward, pinned to the TransformerLens
                                   model by a parity test
  trainer.py                       training K models at once -> TrainResult (shape_trainer.py:
                                   runs of different shapes and tasks as one stack, in buckets that
                                   fit a memory budget); optimizer.py: both families' Adam;
                                   train_state.py: resumable training state
  checkpoint.py                    saving and reading checkpoints of every task kind
  bridge.py                        the TransformerLens model (TransformerBridge), and `load`:
                                   checkpoint -> (model, task) for either family
"""
from models.aot.config import AoTModelConfig, AoTTrainConfig
from models.bridge import build_bridge, load, resolve_device
from models.checkpoint import Checkpoint, CheckpointError, load_checkpoint, read_config
from models.recall.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from models.recall.presets import preset
from models.section import ModelSection

__all__ = ["build_bridge", "load", "resolve_device", "Checkpoint", "CheckpointError", "load_checkpoint",
           "read_config", "AoTModelConfig", "AoTTrainConfig", "ModelConfig", "RunConfig", "TaskConfig",
           "TrainConfig", "preset", "ModelSection"]
