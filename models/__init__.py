"""The models, a folder per family and one for each thing the families share
(docs/architecture.md):

  recall/      the factual-recall family (Nichani, Lee & Bietti): config.py, presets.py (what a
               model is, the named presets and `preset`), parameterisation.py (the authors'
               departures), weights.py, trainer.py (K models at once -> TrainResult),
               training_data.py (every model's batches), fits.py (refusing a run too large for
               the device), shape_trainer.py and shape_stack.py (runs of different shapes and
               tasks as one padded stack), train.py (`python -m models.train`), constructions.py,
               memories.py, pruning.py
  aot/         the attention-only family (Dana et al.): config, weights, forward, trainer, train
  induction/   the induction family (Bietti et al. 2023): section, config, weights, forward,
               construction, trainer, train
  training/    the machinery every family's trainer uses: optimizer.py (Adam), graphed.py (a
               step replayed as a CUDA graph), capture_check.py, train_state.py (resumable
               state), result.py (TrainResult), divergence.py (dropping a diverged model),
               progress.py, subnormals.py
  cores/       the fast forward's attention cores (forward.py) and their Triton kernels
               (fused_attention.py, fused_kernels.py), pinned to the TransformerLens model by
               parity tests
  section.py   what a checkpoint says a model is, for every family: the config.json `model`
               section (ModelSection), the weights' keys and shapes
  checkpoint.py  saving and reading checkpoints of every task kind
  bridge.py    the TransformerLens model (TransformerBridge) and `load`: checkpoint -> (model,
               task) for any family; tokenizer.py the task's strings on it; answer_calls.py its
               return_type="loss" and `generate` in the task's answer vocabulary
  cli.py       the command lines' plumbing: config fields with help (`setting`), `override`
  out_folder.py  the --out folder a command writes, and what --force replaces

Imports point down: a family uses training/, cores/ and the checkpoint format; those never
import a family; no family imports another (tests/test_layout.py).
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
