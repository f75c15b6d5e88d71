"""In-context associations and the induction head (Bietti et al. 2023): `python -m analyses.induction`.

  studies.py   the studies as functions returning DataFrames (one layer against two, probes over
               training, joint against alone, the MLP's bigram KL over training)
  figures.py   their figures; report.py the circuit page (circuitsvis, offline)
  cli.py       the command line
"""
