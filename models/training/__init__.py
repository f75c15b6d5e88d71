"""The training machinery every model family shares (a family imports it; it imports no family):

  optimizer.py      Adam or gradient descent, one learning rate per model, state on the device
  graphed.py        a training step run eagerly or captured once in a CUDA graph and replayed
  capture_check.py  a CPU check that a step can be captured
  train_state.py    resumable training state, saved with each snapshot
  result.py         TrainResult (a trained model ready to be saved), the data-seed offset, the
                    snapshot schedule
  progress.py       progress bars, on a terminal only
  subnormals.py     subnormal floats flushed to zero on every CPU thread while training
"""
