"""python -m analyses.capacity memory|transformer|departures|plan|zipf|oscillation|overoptimisation :
how many associations / facts fit, and what a memory of finite size recalls of Zipf data?

memory       For each size, binary-search the largest number N* of associations an
             associative memory (models/recall/memories.py) stores at >= 99% accuracy (best over
             training), per seed. Linear memories: N* against d (theory ~ d^2 up to a log);
             low-rank linear (--m = rank) and MLP memories (--m = width): N* against m*d.
transformer  For each shape (alpha = H*d_h/d, beta = m/d, H) and each d, binary-search the
             largest S = R (D fixed) a one-layer transformer learns to >= 99% held-out
             accuracy, the learning rates trained as one batched run; facts stored S*R
             against the parameter count 4*H*d_h*d + 2*m*d (paper Figure 4 left).
departures   Which of the authors' departures from the standard model (models/recall/parameterisation.py)
             changes that: each variant (standard, standard + one departure, authors,
             authors - one) trained at one shape, size and S = R as a transformer probe,
             with the state it starts from (dead MLP units, attention-score spread).
plan         What a transformer sweep (its flags) would spend before it runs: its searches
             answered by recorded results, model-steps by shape and d and in total under
             today's rules and the new ones (--give-up milestones --fill-rounds), the time on
             one H100, and the milestone rule's validation on every recorded curve.
zipf         The error of associative memories of size d under Zipf data p(z) ∝ z^-α against
             the samples n and d, for the talk's memory schemes (counts, seen once, seen s
             times) and the memories optimisers learn (one gradient step, SGD, Adam), with
             the exponents beside the talk's laws (docs/capacity.md).
oscillation  Gradient descent on two correlated, imbalanced tokens over steps: a large step
             oscillates, yet reaches perfect accuracy sooner (ICML 2024).
overoptimisation  Gradient descent on N tokens in d = 2: the error over steps against the best
             over training and the best of any memory.

memory and transformer fit the log-log slope (summary.json `fitted_slope`, with its 95% interval under `fit`;
undetermined with two sizes or fewer) and write, to --out: cells/ (one
JSON per probe: a re-run with the same settings skips what is recorded), probes.csv,
capacity.csv (one row per size and seed), summary.json and a figure with the theory lines.
Memories are also read against the line the paper draws (`authors_line`: N ln N = d^2/1.3
for the linear memory, N ln N = m d / 0.35 for the MLP, N = m d / 1.2 for the MLP with M = 32
fixed outputs, --outputs 32): the slope of log(N* ln N*) and N* over the line at every size.
The searches run concurrently, each probe a cell: in this process (--executor local), in
--jobs worker processes of this machine (--executor processes) or as Ray tasks (--executor
ray: one worker per core, or a cluster with --ray-address).
"""
import importlib

# each name from its module, imported on first use: the package itself imports nothing heavy, so
# `python -m analyses.capacity.protocol pieces` (scripts/gpu_run.sh) answers without torch
_MODULES = {"main": "cli", "parser": "cli", "TARGET": "common", "Capacity": "common", "fitted_slope": "common",
            "MemorySweep": "memory", "authors_line": "memory", "memory_report": "memory",
            "TransformerSweep": "transformer", "paper_window": "transformer", "shape_capacity": "transformer",
            "transformer_row": "transformer"}
__all__ = list(_MODULES)


def __getattr__(name: str):
    if name not in _MODULES:
        raise AttributeError(f"module 'analyses.capacity' has no attribute {name!r}")
    return getattr(importlib.import_module(f"analyses.capacity.{_MODULES[name]}"), name)
