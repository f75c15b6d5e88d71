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


def test_each_rate_is_read_from_its_own_clock(monkeypatch):
    """Sequences per wall-clock second from time.perf_counter, per CPU second from time.process_time: on a
    loaded machine the two differ (fake clocks: 1 s of wall clock and 0.25 s of CPU for every run)."""
    import bench.induction_sampler as bench
    ticks = {"wall_s": 0.0, "cpu_s": 0.0}

    def clock(name, step):
        def read():
            ticks[name] += step
            return ticks[name]
        return read
    monkeypatch.setattr(bench, "CLOCKS", {"wall_s": clock("wall_s", 1.0), "cpu_s": clock("cpu_s", 0.25)})
    result = measure(8, 16, "fixed", 2, 3, "cpu")
    for name in ("ours", "loop"):
        assert result[name]["sequences_per_wall_s"] == 8 / 1.0  # one tick between a run's start and end
        assert result[name]["sequences_per_cpu_s"] == 8 / 0.25
