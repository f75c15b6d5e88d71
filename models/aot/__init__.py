"""The attention-only family: the one-layer models of the memorisation tasks (Dana et al.),
one file per job:

  config.py     what a model is: AoTModelConfig (the standard and the dana head layouts) and
                Dana et al.'s training recipe, AoTTrainConfig
  weights.py    its weights: shapes, initialisation, the dana layout's TransformerLens form,
                padded stacks of K models
  forward.py    the trainer's fast forward on the whole population of sequences, pinned to the
                TransformerLens model by tests/test_aot_models.py
  trainer.py    training K models at once -> models.training.result.TrainResult

What every family shares lives outside this folder: the checkpoint section and the weights'
keys (models/section.py), saving and reading (models/checkpoint.py), the TransformerLens model
(models/bridge.py), Adam, the CUDA-graph step and TrainResult (models/training/).
"""
