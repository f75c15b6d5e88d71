"""The factual-recall family (Nichani, Lee & Bietti 2024), one file per job:

  config.py, presets.py   what a model is and how it is trained (frozen configs), the named
                          presets and `preset`; parameterisation.py the authors' departures
  weights.py              its weights: initialisation, trainable keys, stacks of K models
  trainer.py              K models (learning rates x seeds) trained at once -> TrainResult
  shape_trainer.py        runs of different shapes and tasks as one zero-padded stack
                          (shape_stack.py: the padding, and buckets that fit a memory budget)
  train.py                `python -m models.train`: train and write a checkpoint
  constructions.py        hand-built models with known storage (`python -m models.recall.constructions`)
  memories.py             the associative memories of the capacity study
  pruning.py              neurons and heads pruned by norm

Its fast forward is models/cores/; what it shares with every family is models/training/ and
the checkpoint format (models/section.py, checkpoint.py, bridge.py).
"""
