"""The sampler benchmark at its smallest size: both samplers run side by side and draw the same task."""
import numpy as np

from bench.induction_sampler import AuthorsLoop, main, measure
from tasks.induction import InductionTask


def test_the_benchmark_runs_both_samplers_at_its_smallest_size(capsys):
    assert main(["--batch", "4", "--seq-len", "8", "--rounds", "1", "--triggers", "random"]) == 0
    out = capsys.readouterr().out
    assert "ours (vectorised)" in out and "authors' loop (baseline)" in out and "ours_over_loop" in out


def test_the_baseline_loop_draws_the_tasks_sequences():
    task = InductionTask(n_triggers=2, seq_len=12)
    seqs, counters = AuthorsLoop(task).batch(np.random.default_rng(0), 16)
    assert seqs.shape == (16, 13) and counters.shape == (16, 13)
    q = task.fixed_triggers.tolist()
    for seq, cnt in zip(seqs, counters):
        follows = {}
        for t in range(12):
            if seq[t] in q:
                assert follows.setdefault(seq[t], seq[t + 1]) == seq[t + 1]  # always the same output
                assert cnt[t] == list(seq[:t + 1]).count(seq[t])
            else:
                assert cnt[t] == 0


def test_the_two_samplers_agree_on_the_share_of_in_context_positions():
    result = measure(256, 64, "fixed", 5, 1, "cpu")
    assert abs(result["ours"]["in_context_share"] - result["loop"]["in_context_share"]) < 0.03
