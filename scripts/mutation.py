"""python scripts/mutation.py MODULE [MODULE ...] [--max-children 1] [--work DIR] [--survivors]

Mutation testing (mutmut) of modules outside the instruments' configuration in pyproject.toml
(docs/testing.md): each module in a scratch copy of the working tree (DIR/<module>, default
/tmp/factual-recall-mutation), whose [tool.mutmut] mutates that module alone and runs the
tests that cover it (MODULES below, fast ones: no CLI subprocess, no long training). Prints
per module the mutants, killed, survived and the score, and writes the survivors' names to
DIR/<module>/survivors.txt (`mutmut show NAME` there prints one). --survivors keeps a scratch
copy's results and tests again only its survivors, against the working tree's tests as they
are now (after tests were added).

Run it with OMP_NUM_THREADS=1 (mutmut forks after torch is loaded). mutmut may come from the
venv or from PYTHONPATH (say `pip install --target DIR mutmut==3.8.1`, PYTHONPATH=DIR); entries
of PYTHONPATH inside the working tree are dropped for mutmut's run (the mutants would not be
the code imported).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["tasks/", "probe/", "models/", "analyses/"]

# module -> the tests that cover it (pytest arguments)
MODULES = {
    "probe/metrics.py": ["tests/test_patching_metrics.py"],
    "probe/paths.py": ["tests/test_locate_depth.py", "-k", "not command_line"],
    "tasks/two_hop.py": ["tests/test_two_hop.py", "-k", "not study and not records_each and not lens_at_the_last and "
                         "not each_prompts_row"],
    "analyses/two_hop.py": ["tests/test_two_hop_study.py",
                            "tests/test_two_hop.py::test_the_baselines_need_no_composition"],
    "probe/bridge.py": ["tests/test_two_hop.py", "-k", "probe or rank or resolution or lens_at_the_last or "
                        "wrong_answer or each_prompts_row"],
    "probe/attribution_patching.py": ["tests/test_attribution_patching.py"],
    "probe/hops.py": ["tests/test_hops.py", "-k", "not writes_each"],
    "analyses/hops_summary.py": ["tests/test_hops.py", "-k", "summary or report or figure"],
    "analyses/hops.py": ["tests/test_hops_command.py", "tests/test_hops.py", "-m", "not slow"],
    "probe/editing.py": ["tests/test_editing.py", "tests/test_editing_depth.py", "tests/test_edit_facts_cli.py",
                         "tests/test_editing_mutants.py", "tests/test_editing_deeper.py",
                         "tests/test_edit_values.py", "tests/test_edit_auto.py", "tests/test_edit_value_choice.py"],
    "probe/edit_keys.py": ["tests/test_editing.py", "tests/test_editing_depth.py", "tests/test_editing_deeper.py"],
    "probe/edit_effects.py": ["tests/test_editing.py", "tests/test_edit_facts_cli.py"],
    "probe/edit_values.py": ["tests/test_edit_values.py", "tests/test_edit_value_choice.py"],
    "analyses/edit_facts.py": ["tests/test_edit_facts_cli.py", "tests/test_edit_facts_mutants.py"],
    "analyses/edit_view.py": ["tests/test_edit_study.py", "tests/test_edit_view_mutants.py", "-k",
                              "report_s_edit or view"],
    "analyses/edit_counts.py": ["tests/test_edit_counts.py"],
    "analyses/edit_study.py": ["tests/test_edit_study.py", "tests/test_edit_study_depth.py", "-m", "not slow", "-k",
                               "not report_s_edit"],
    "analyses/edit_study_depth.py": ["tests/test_edit_study_depth.py", "tests/test_edit_study.py", "-m", "not slow",
                                     "-k", "not report_s_edit"],
    "probe/edit_stores.py": ["tests/test_edit_study_depth.py", "-m", "not slow"],
    "analyses/tradeoff/grid.py": ["tests/test_tradeoff_grid_tables.py"],
    "models/recall/shape_stack.py": ["tests/test_shape_stack.py", "tests/test_stack_buckets.py", "-k",
                                     "not equals_its_run_alone and not stay_zero"],
    "models/training/train_state.py": ["tests/test_train_state.py",
                                       "tests/test_graphed.py::test_a_restore_copies_into_the_live_"
                                       "tensors_and_rebinds_none", "tests/test_reliability.py::test_resume_from_a_"
                                       "middle_state_equals_the_uninterrupted_run"],
    "analyses/report.py": ["tests/test_report_page.py"],
    "analyses/recorded.py": ["tests/test_recorded.py"],
    "models/cli.py": ["tests/test_list_flags.py"],
    "models/training/capture_check.py": ["tests/test_capture_check.py"],
    "analyses/capacity/transformer.py": ["tests/test_capacity_transformer_tables.py",
                                         "tests/test_capacity_transformer.py", "-k",
                                         "writes_tables_and_reads or shape_sizes or shape_search or seeds_takes or "
                                         "paper_window or bad_shape or records_each_seed_and_resumes or "
                                         "transformer_tables"],
    "models/recall/shape_trainer.py": ["tests/test_shape_stack.py", "tests/test_stack_buckets.py", "-k",
                                       "small_stack or whatever_reaches or trains_each_bucket or are_refused"],
    "models/training/graphed.py": ["tests/test_graphed.py", "-k", "not cli"],
    "models/cores/fused_attention.py": ["tests/test_fused_attention.py",
                                        "tests/test_capture_check.py::test_the_fused_core_s_token_order_is_capturable"],
    "analyses/sweeps/executors.py": ["tests/test_sweep.py"],
    "analyses/sweeps/gpu_records.py": ["tests/test_gpu_records.py", "tests/test_gpu_run.py",
                                       "tests/test_capacity_progress.py", "-m", "not slow", "-k",
                                       "not refuses_a_missing_archive"],
    "analyses/capacity/zipf/memory.py": ["tests/test_capacity_zipf.py"],
    "analyses/capacity/zipf/optimisers.py": ["tests/test_capacity_zipf.py", "-k", "step or sgd or adam or read_back"],
    "analyses/capacity/zipf/fits.py": ["tests/test_capacity_zipf_fits.py", "tests/test_capacity_zipf_cli.py::test_fits_"
                                       "beside_the_talk_s_laws_and_none_drawn_for_alpha_at_most_one", "-k",
                                       "not descent and not orthogonal and not problems and not best_error"],
    "analyses/capacity/zipf/dynamics.py": ["tests/test_capacity_zipf_fits.py", "-k",
                                           "descent or orthogonal or problems or best_error"],
    # the induction family
    "probe/induction.py": ["tests/test_induction_probes.py", "tests/test_induction_reference.py"],
    "models/induction/fits.py": ["tests/test_induction_trainer.py", "-k", "memory_estimate or cannot_fit"],
    "tasks/induction.py": ["tests/test_induction_task.py", "tests/test_induction_bench.py"],
    "models/induction/forward.py": ["tests/test_induction_models.py", "-k", "fast_forward or stack or simplified"],
    "models/induction/weights.py": ["tests/test_induction_models.py", "tests/test_induction_trainer.py", "-k",
                                    "not process and not cli and not cpu_preset"],
    "models/induction/config.py": ["tests/test_induction_models.py", "tests/test_induction_trainer.py", "-k",
                                   "not process and not cpu_preset"],
    "models/induction/construction.py": ["tests/test_induction_probes.py"],
    "models/induction/trainer.py": ["tests/test_induction_trainer.py", "-k", "not process"],
    "models/induction/train.py": ["tests/test_induction_trainer.py", "-k", "cli and not process"],
    "analyses/induction/studies.py": ["tests/test_induction_analyses.py", "-k", "not process"],
    "analyses/induction/cli.py": ["tests/test_induction_analyses.py", "tests/test_induction_cli.py", "-k",
                                  "not process"],
    "analyses/induction/figures.py": ["tests/test_induction_analyses.py", "-k", "not process"],
    "analyses/induction/report.py": ["tests/test_induction_analyses.py", "-k", "circuit or own_results"],
    "analyses/capacity/plan.py": ["tests/test_capacity_plan.py"],
    "tasks/triton_kernels.py": ["tests/test_triton_kernels.py", "tests/test_counter.py"],
    "analyses/locate_facts.py": ["tests/test_locate_facts.py", "tests/test_locate_depth.py",
                                 "tests/test_docs.py::test_shown_output_is_what_the_command_prints", "-k",
                                 "not cli_writes and not bad_checkpoint and not trained_model"],
    "analyses/locate_summary.py": ["tests/test_intervals.py", "tests/test_locate_depth.py",
                                   "tests/test_locate_facts.py", "-k",
                                   "not cli_writes and not bad_checkpoint and not trained_model"],
    # L-layer models
    "models/cores/deep.py": ["tests/test_depth.py", "tests/test_deep_constructions.py"],
    "models/recall/deep_constructions.py": ["tests/test_deep_constructions.py"],
    "probe/causal_tracing.py": ["tests/test_causal_tracing.py", "tests/test_causal_tracing_parts.py",
                                "tests/test_hops.py", "-k",
                                "not cli and not summary_and_report and not second_run and not writes_each"],
    "analyses/causal_tracing.py": ["tests/test_causal_tracing.py", "tests/test_causal_tracing_parts.py"],
    "models/aot/train.py": ["tests/test_aot_models.py", "tests/test_docs.py", "-k",
                            "command_line or task_seed or shown_output_is"],
}


# mutmut's other settings for a module. Ray's gRPC state does not survive a fork: mutmut's
# default runner runs the clean and stats passes in its own process, so the Ray tests start Ray
# there and every mutant forked from it hangs in Ray's first call (docs/testing.md). Its fork
# server never runs a test itself: each pass and each mutant starts Ray afresh.
SETTINGS = {"analyses/sweeps/executors.py": {"process_isolation": "forkserver"}}


def configured(pyproject: str, module: str) -> str:
    """pyproject.toml's text with its [tool.mutmut] table replaced by one for `module`."""
    table = {"source_paths": [module.split("/")[0] + "/"], "only_mutate": [module],
             "also_copy": [p for p in PACKAGES if not module.startswith(p)] + ["docs/", "notebooks/", "results/",
                                                                               "scripts/", "bench/", "README.md"],
             "pytest_add_cli_args_test_selection": MODULES[module], **SETTINGS.get(module, {})}
    body = "\n".join(f"{key} = {json.dumps(value)}" for key, value in table.items())
    rest = re.sub(r"^\[tool\.mutmut\].*?(?=^\[|\Z)", "", pyproject, flags=re.S | re.M)
    return rest.rstrip() + "\n\n[tool.mutmut]\n" + body + "\n"


def scratch_copy(module: str, work: Path, keep: bool) -> Path:
    """The working tree's files (tracked and untracked, not ignored) in work/<module>."""
    where = work / module.replace("/", "_").removesuffix(".py")
    if where.exists() and not keep:
        shutil.rmtree(where)
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.splitlines()
    for name in files:
        if (ROOT / name).is_file():
            (where / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, where / name)
    (where / "pyproject.toml").write_text(configured((ROOT / "pyproject.toml").read_text(), module))
    return where


def measure(module: str, work: Path, max_children: int, survivors_only: bool) -> dict:
    """Run mutmut on `module` (or on the survivors of its last run); its counts and survivors."""
    where = scratch_copy(module, work, survivors_only)
    again = (where / "survivors.txt").read_text().splitlines() if survivors_only else []
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    outside = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
               if p and Path(p).resolve() != ROOT and ROOT not in Path(p).resolve().parents]
    if outside:
        env["PYTHONPATH"] = os.pathsep.join(outside)
    env["OMP_NUM_THREADS"] = "1"
    mutmut = [sys.executable, "-m", "mutmut"]
    names = [name for name, _, status in (line.partition(": ") for line in again) if status != "not checked"]
    subprocess.run([*mutmut, "run", "--max-children", str(max_children), *names], cwd=where, env=env, check=False)
    subprocess.run([*mutmut, "export-cicd-stats"], cwd=where, env=env, check=True, capture_output=True)
    stats = json.loads((where / "mutants" / "mutmut-cicd-stats.json").read_text())
    listed = subprocess.run([*mutmut, "results"], cwd=where, env=env, check=True, capture_output=True, text=True)
    survivors = [line.strip() for line in listed.stdout.splitlines() if line.strip()]
    (where / "survivors.txt").write_text("\n".join(survivors) + "\n")
    tested = stats["total"] - stats["skipped"]
    if survivors_only:  # the mutants not tested again were killed before
        stats["killed"] = tested - stats["survived"] - stats["no_tests"] - stats["timeout"]
    score = (stats["killed"] + stats["timeout"]) / tested if tested else float("nan")
    return {**stats, "score": score, "survivors": survivors, "folder": str(where)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("modules", nargs="+", choices=list(MODULES), metavar="MODULE")
    p.add_argument("--max-children", type=int, default=1)
    p.add_argument("--work", type=Path, default=Path("/tmp/factual-recall-mutation"))
    p.add_argument("--survivors", action="store_true")
    args = p.parse_args()
    for module in args.modules:
        r = measure(module, args.work, args.max_children, args.survivors)
        print(f"{module}: {r['total']} mutants, {r['killed'] + r['timeout']} killed, {r['survived']} survived, "
              f"{r['no_tests']} reached by no test: {100 * r['score']:.1f}%  ({r['folder']}/survivors.txt)",
              flush=True)


if __name__ == "__main__":
    main()
