"""What the GPU runs of scripts/gpu_run.sh left in the repository (results/gpu/), so that a
call spends its minutes on what is new:

  passed.json    what passed on a GPU at which code: the CUDA tests in full (`tests`) or their
                 subset (`tests_subset`), and bench/gpu_checks.py (`checks`)
  measured.json  each bench line's steps per second by attention core, at which code (the
                 `auto` attention core reads it: models.cores.forward.choose_core)
  done/NAME      each sweep piece a GPU run finished

Code is named by a hash of its files' paths and bytes (`code_hash`), so a copy of the tree
without its git history (a lent GPU machine's) names it as the checkout does; the commit,
where git knows it, is recorded beside it for a reader.

    python -m analyses.sweeps.gpu_records hash tests|bench               the code hash of a set of paths
    python -m analyses.sweeps.gpu_records get FILE ENTRY FIELD           a recorded field ('' when absent)
    python -m analyses.sweeps.gpu_records set FILE ENTRY FIELD=VALUE...  record an entry (date and commit added)
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the code a GPU runs (the CUDA tests' subject and the tests themselves), and the code a training step runs
STEP = ("models/cores/forward.py", "models/cores/fused_attention.py", "models/cores/fused_kernels.py",
        "models/training/optimizer.py", "models/training/adam_kernel.py", "models/training/graphed.py",
        "models/recall/trainer.py", "models/recall/shape_stack.py", "models/recall/weights.py",
        "models/recall/config.py", "models/recall/presets.py", "models/section.py", "tasks/factual_recall.py",
        "tasks/counter_sampler.py", "tasks/counter.py", "tasks/counter_kernel.py", "tasks/triton_kernels.py",
        "tasks/batch.py", "bench/train_throughput.py", "bench/step_profile.py", "bench/step_cost.py")
BENCH_LINES = ("stack-169", "config-a", "tiny-k64", "tiny-k1")  # scripts/gpu_run.sh's, in its order
CODE = {"tests": ("models", "tasks", "probe", "analyses/locate_facts.py", "bench/gpu_checks.py", "tests/conftest.py",
                  "tests/test_graphed.py", "tests/test_parity.py", "tests/test_trainer.py", "tests/test_shape_stack.py",
                  "tests/test_stack_resume.py", "tests/test_grid_stack.py", "tests/test_stack_buckets.py",
                  "tests/test_counter.py", "tests/test_fused_attention.py", "tests/test_adam_kernel.py",
                  "tests/test_authors_model.py", "tests/test_locate_facts.py", "tests/test_reliability.py"),
        "bench": STEP}


def code_hash(paths, root: Path = ROOT) -> str:
    """A short hash of the Python files at `paths` (files or folders, relative to `root`):
    their paths and bytes, in path order; absent paths count as absent."""
    digest = hashlib.sha256()
    files = sorted({p for path in paths for p in ((root / path).rglob("*.py") if (root / path).is_dir()
                                                 else [root / path] if (root / path).is_file() else [])})
    for file in files:
        digest.update(str(file.relative_to(root)).encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def commit(root: Path = ROOT) -> str:
    """The checkout's commit (with '+changes' where files differ from it): GPU_RUN_COMMIT where set
    (a copy of the tree without git, as a lent GPU machine has, is told it), else git's, else
    'unknown'."""
    if os.environ.get("GPU_RUN_COMMIT"):
        return os.environ["GPU_RUN_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def read(path: Path) -> dict:
    """A record file's entries ({} where absent or unreadable)."""
    try:
        entries = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return entries if isinstance(entries, dict) else {}


def record(path: Path, entry: str, fields: dict) -> None:
    """Set `entry` of the record file to `fields`, with the date and the commit (atomically)."""
    entries = read(path)
    entries[entry] = {**fields, "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                      "commit": commit()}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")  # no torch here: gpu_run.sh calls this between its steps
    tmp.write_text(json.dumps(entries, indent=1) + "\n")
    os.replace(tmp, path)


def run(argv: list[str]) -> int:
    if argv[:1] == ["hash"] and len(argv) == 2 and argv[1] in CODE:
        print(code_hash(CODE[argv[1]]))
    elif argv[:1] == ["get"] and len(argv) == 4:
        value = read(Path(argv[1])).get(argv[2], {})
        print(value.get(argv[3], "") if isinstance(value, dict) else "")
    elif argv[:1] == ["set"] and len(argv) >= 3 and all("=" in f for f in argv[3:]):
        record(Path(argv[1]), argv[2], dict(f.split("=", 1) for f in argv[3:]))
    else:
        print("usage: python -m analyses.sweeps.gpu_records hash tests|bench | get FILE ENTRY FIELD | "
              "set FILE ENTRY FIELD=VALUE...", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
