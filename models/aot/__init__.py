"""The attention-only family: the one-layer models of the memorisation tasks (Dana et al.),
one file per job:

  config.py     what a model is: AoTModelConfig (the standard and the dana head layouts) and
                Dana et al.'s training recipe, AoTTrainConfig
  weights.py    its weights: shapes, initialisation, the dana layout's TransformerLens form,
                padded stacks of K models
  forward.py    the trainer's fast forward on the whole population of sequences, pinned to the
                TransformerLens model by tests/test_aot_models.py
  trainer.py    training K models at once -> models.training.result.TrainResult

The pieces both families share stay in models/: the checkpoint section (section.py), Adam
(optimizer.py), saving and reading (checkpoint.py) and the TransformerLens model (bridge.py).
"""
