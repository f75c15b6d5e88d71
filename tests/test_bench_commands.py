"""Every benchmark command bench/README.md documents runs as documented, at its smallest size:
read from the page (its bash blocks and its inline `python bench/...` commands), the sizes
replaced by the smallest the script takes (SMALLEST), run in a fresh process, and its last
result line printed. A command documented for a CUDA device is skipped, saying so, on a
machine without one; every other command runs on the CPU, whatever its script's default
device. A script the page documents and SMALLEST does not know fails the test. The first
command of each script runs as `python bench/SCRIPT`, a fresh interpreter; the script's other
commands each run in a process of their own forked from one that has imported torch and
TransformerLens once (FORK_SERVER), as `python bench/SCRIPT` runs it."""
import json
import os
import re
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "bench" / "README.md"
SCRIPT = re.compile(r"(?:^|\s)(?:\S*python3?\s+)?bench/(\w+\.py)(?=\s|$)")


def _command(text: str, inline: bool) -> tuple[str, list[str]] | None:
    """(script, arguments) of one command line, its [optional flags] (defaults shown) and
    comments dropped; None where the text only names a script (inline, no python, no flags)."""
    m = SCRIPT.search(text)
    if m is None:
        return None
    rest = re.sub(r"\[[^\]]*\]", " ", text[m.end():].split(" #")[0])
    words = rest.split()
    if inline and not words and "python" not in text[:m.end()]:
        return None
    return m.group(1), words


def documented_commands(page: str) -> list[tuple[str, list[str]]]:
    """Every bench command of the page: its bash blocks' lines (continuations joined) and its
    inline code that runs a bench script, in the page's order."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", page, re.S | re.M):
        commands += [c for line in block.replace("\\\n", " ").splitlines() if (c := _command(line, False))]
    prose = re.sub(r"^```.*?^```", "", page, flags=re.S | re.M)
    commands += [c for span in re.findall(r"`([^`]+)`", prose) if (c := _command(" ".join(span.split()), True))]
    return commands


def flags(argv: list[str]) -> dict[str, str | None]:
    """argv as argparse reads it here: --flag value or --flag alone, the last one winning."""
    out, i = {}, 0
    while i < len(argv):
        value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None
        out[argv[i]] = value
        i += 1 if value is None else 2
    return out


def _locate_facts_speed(argv: list[str], where: dict) -> list[str]:
    if "--ckpt" in argv:
        return ["--ckpt", str(where["tiny"]), "--repeats", "1", "--device", "cpu"]
    return ["--preset", "tiny", "--train-steps", "8", "--repeats", "1", "--device", "cpu"]


# Each script's smallest size: flags appended to the documented ones (the last of a flag
# wins), given the documented arguments and `where` (tmp: a scratch folder; tiny: the tiny
# preset's checkpoint).
SMALLEST = {
    "train_throughput.py": lambda argv, where: [
        "--batch", "16", "--repeats", "1", "--steps", "1", "--round-seconds", "0", "--memory-seq-lens", "8",
        "--trained-state", str(where["tmp"] / "trained"),
        *(["--trained-steps", "8"] if flags(argv).get("--trained-steps") != "0" else []),
        *(["--device", "cpu"] if "--device" not in argv else []),
        *(["--no-memory"] if flags(argv).keys() - {"--device"} else [])],  # the memory path: by the default
    "step_cost.py": lambda argv, where: [],  # arithmetic only
    "core_cost.py": lambda argv, where: [],  # arithmetic only
    "attention_cores.py": lambda argv, where: [
        "--k", "1", "--heads", "2", "--batch", "8", "--shapes", "17x4", "--repeats", "1", "--round-seconds", "0",
        "--profile-steps", "1", "--rows", "3", "--d-mlp", "8",
        *(["--device", "cpu"] if "--device" not in argv else [])],
    "step_kernels.py": lambda argv, where: ["--batch", "4", "--preset", "tiny"],
    "step_profile.py": lambda argv, where: ["--small", "--steps", "1", "--rows", "3", "--device", "cpu"],
    "stack_speed.py": lambda argv, where: ["--cells", "8:3,11:4", "--shape", "1,1,2", "--batch-size", "8",
                                           "--steps", "1", "--rounds", "1"],
    "locate_facts_speed.py": _locate_facts_speed,
    "sweep_speed.py": lambda argv, where: [
        "--heads", "1", "--widths", "4", "--steps", "2", "--workers", "1", "--empty", "2", "--contexts", "2",
        "--patch-contexts", "1", "--n-subjects", "4", "--n-relations", "2", "--answers-per-relation", "2",
        "--n-noise", "4", "--seq-len", "4"],
    "subnormal_seeds.py": lambda argv, where: ["--cells", "1x4", "--seeds", "0", "--steps", "2",
                                               "--out", str(where["tmp"] / "subnormals")],
    "induction_sampler.py": lambda argv, where: ["--batch", "8", "--seq-len", "16", "--rounds", "1"],
    "induction_step.py": lambda argv, where: ["--batch", "4", "--seq-len", "16", "--d-model", "16", "--steps", "1",
                                              "--rounds", "1"],
}
# Run by another test, which runs the documented command itself.
ELSEWHERE = {"kernel_resources.py": "tests/test_kernel_resources.py"}
# The last result line each prints.
RESULT = {"train_throughput.py": "speedup_vs_transformerlens ", "step_cost.py": "  floor ",
          "core_cost.py": r"\s+fused:", "attention_cores.py": r"profile: |\s+fused:",
          "step_kernels.py": "  a whole step",
          "step_profile.py": "model_flop_utilisation |depth_step ", "stack_speed.py": "median alone / stack: ",
          "locate_facts_speed.py": "locate_facts_seconds ", "sweep_speed.py": "ray_overhead_per_cell_s ",
          "subnormal_seeds.py": "", "induction_sampler.py": "ours_over_loop ",
          "induction_step.py": r"simplified: +[\d.]+ s/step"}  # subnormal_seeds' tables: below
# Scripts of bench/ that bench/README.md does not document, and where they are.
UNDOCUMENTED = {"gpu_checks.py": "docs/gpu.md (CUDA only; tests/test_cli.py runs its refusal without CUDA)"}


def _runs() -> list[tuple[str, list[str]]]:
    """The documented commands, each once (two that differ in sizes only are run once)."""
    seen, runs = set(), []
    for script, argv in documented_commands(README.read_text()):
        if script in ELSEWHERE:
            continue
        key = (script, tuple(sorted(flags(argv + SMALLEST.get(script, lambda a, w: [])(argv, WHERE)).items(),
                                    key=str)))
        if key not in seen:
            seen.add(key)
            runs.append((script, argv))
    return runs


WHERE = {"tmp": Path("TMP"), "tiny": Path("TINY")}  # stand-ins for the run's folders, to tell runs apart


def test_the_page_s_commands_are_read(tmp_path):
    page = ("```bash\nOMP_NUM_THREADS=1 .venv/bin/python bench/a.py [--k 1] \\\n    --batch 8  # a comment\n```\n"
            "Named only: `bench/b.py`; run: `.venv/bin/python bench/b.py` and `bench/c.py --x 1\n  --y`.\n")
    assert documented_commands(page) == [("a.py", ["--batch", "8"]), ("b.py", []), ("c.py", ["--x", "1", "--y"])]
    assert flags(["--k", "1", "--profile", "--k", "2"]) == {"--k": "2", "--profile": None}


def test_every_documented_script_has_a_smallest_size_and_every_script_is_documented():
    documented = {script for script, _ in documented_commands(README.read_text())}
    assert documented - SMALLEST.keys() - ELSEWHERE.keys() == set()  # a new documented script: give it a size
    scripts = {p.name for p in (ROOT / "bench").glob("*.py") if '__name__ == "__main__"' in p.read_text()}
    assert scripts - documented - UNDOCUMENTED.keys() == set()
    assert SMALLEST.keys() <= documented and RESULT.keys() == SMALLEST.keys()
    for script, test in ELSEWHERE.items():
        assert f'"bench/{script}"' in (ROOT / test).read_text(), test
    assert len(_runs()) >= 12  # the page's commands, not a parse that found nothing


ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
# A process that imports torch and TransformerLens once, then runs each command it is sent (a line
# of JSON: the script's path, its argv, files for stdout and stderr) in a process forked from it, that
# command's own, as `python bench/SCRIPT ARGS` runs it (the script as __main__ with its absolute
# __file__, its folder first on sys.path): it says the child's pid, then its exit code (minus the
# signal's number when a signal ended it). Nothing computes before a fork: one torch thread, no CUDA.
FORK_SERVER = """
import json, os, runpy, sys, traceback
import torch, transformer_lens
for line in sys.stdin:
    path, argv, out, err = json.loads(line)
    pid = os.fork()
    if pid == 0:
        for fd, file in ((1, out), (2, err)):
            os.dup2(os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.argv, sys.path[0], code = argv, os.path.dirname(path), 0
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as done:  # as the interpreter ends on it: None is 0, a message is printed and 1
            if done.code is None or isinstance(done.code, int):
                code = done.code or 0
            else:
                print(done.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(code)
    print(pid, flush=True)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
"""


@pytest.fixture(scope="module")
def forker():
    """The fork server (FORK_SERVER), started for the first command that uses it in this process."""
    server = subprocess.Popen([sys.executable, "-c", FORK_SERVER], cwd=ROOT, env=ENV, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, bufsize=0)
    yield server
    server.stdin.close()
    server.wait(timeout=60)


def _forked(server: subprocess.Popen, script: str, argv: list[str], tmp_path: Path) -> tuple[int, str, str]:
    """`python bench/SCRIPT ARGV` run by the fork server: (exit code, stdout, stderr); killed after 300 s."""
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    command = [str(ROOT / "bench" / script), [f"bench/{script}", *argv], str(out), str(err)]
    server.stdin.write((json.dumps(command) + "\n").encode())
    pid = int(server.stdout.readline())
    if not select.select([server.stdout], [], [], 300)[0]:
        os.kill(pid, signal.SIGKILL)
    return int(server.stdout.readline()), out.read_text(), err.read_text()


# The first command of each script: run as a fresh process (its real entry point).
FIRST = {}
for _script, _argv in _runs():
    FIRST.setdefault(_script, _argv)


@pytest.mark.slow  # a second or more of imports before the first command of a script runs
@pytest.mark.parametrize("script, argv", _runs(), ids=lambda x: x if isinstance(x, str) else " ".join(x))
def test_the_documented_command_runs_at_its_smallest_size(script, argv, tiny_ckpt, tmp_path, request):
    if flags(argv).get("--device", "").startswith("cuda") and not _cuda():
        pytest.skip(f"documented for a CUDA device (--device {flags(argv)['--device']}); this machine has none")
    smallest = SMALLEST[script](argv, {"tmp": tmp_path, "tiny": tiny_ckpt})
    if argv == FIRST[script]:
        done = subprocess.run([sys.executable, f"bench/{script}", *argv, *smallest], cwd=ROOT, env=ENV,
                              capture_output=True, text=True, timeout=300)
        code, stdout, stderr = done.returncode, done.stdout, done.stderr
    else:
        code, stdout, stderr = _forked(request.getfixturevalue("forker"), script, [*argv, *smallest], tmp_path)
    said = f"bench/{script} {' '.join(argv + smallest)}\n{stdout[-2000:]}{stderr[-3000:]}"
    assert code == 0, said
    assert re.search(f"^({RESULT[script]})", stdout, re.M), stdout[-2000:]
    if script == "subnormal_seeds.py":
        assert {"runs.csv", "summary.csv"} <= {p.name for p in (tmp_path / "subnormals").iterdir()}


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
