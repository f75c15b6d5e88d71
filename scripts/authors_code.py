"""Runs the authors' own `run.run` (github.com/eshnich/factual-recall-iclr, JAX) at one size
and prints one JSON line. It runs in a side environment outside this project (jax, flax,
optax, simple_pytree, jaxopt), never in the project's venv; nothing of the authors' code is
copied here. Called by scripts/side_by_side.py.

usage: python authors_code.py AUTHORS_DIR H D_HEAD D M S LR SEED
SEED 64 is the authors' own (run.run seeds RNG(64)); another SEED replaces it.
"""
import json
import sys
import time

authors_dir = sys.argv[1]
sys.path.insert(0, authors_dir)
import run  # noqa: E402  (the authors' module)
import util  # noqa: E402

H, d_head, d, m, S = (int(x) for x in sys.argv[2:7])
lr, seed = float(sys.argv[7]), int(sys.argv[8])
if seed != 64:
    run.RNG = lambda _seed, chosen=seed: util.RNG(chosen)
start = time.time()
accuracy = float(run.run(H, d_head, d, m, S, S, 8, lr))  # the best held-out accuracy over the run
print(json.dumps({"best_accuracy": accuracy, "seconds": round(time.time() - start, 1)}))
