"""The induction family: in-context associations and the induction head (Bietti et al. 2023,
*Birth of a Transformer: a Memory Viewpoint*), one file per job:

  config.py     the task, model and training configs (frozen dataclasses) and the presets
  weights.py    initial weights (the authors' initialisations) and which of them train
  forward.py    the trainer's fast forward on K stacked models, pinned to the TransformerLens
                model by tests/test_induction_models.py
  trainer.py    training K models at once on the counter-sampled task; snapshots, resume
  train.py      python -m models.induction.train

The task is tasks/induction.py; the instruments probe/induction.py; the analyses
`python -m analyses.induction`. What a checkpoint says the model is (InductionSection: one or two
layers, layer norm, MLPs; its weight shapes and TransformerBridge config) is in models/section.py
with the other families' sections; saving, reading and `models.load` are shared
(models/checkpoint.py, models/bridge.py); the training machinery is models/training/.
"""
