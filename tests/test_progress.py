"""Progress bars only on a terminal, unless FACTUAL_RECALL_PROGRESS asks for them."""
import io

import pytest

from analyses.sweeps.cells import Cell, Cells, one, run_jobs
from models.training.progress import ENV
from tests.test_sweep import Shuffled, threshold_row


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def sweep(tmp_path) -> None:
    """A sweep of three cells with its progress bar asked for."""
    jobs = [one(Cell(f"c{i}", threshold_row, (1, i))) for i in range(3)]
    run_jobs(jobs, Cells(tmp_path, {}), Shuffled(0), progress=True)


@pytest.mark.parametrize("stderr, setting, shown", [
    (io.StringIO, None, False),  # piped to a log
    (Terminal, None, True),
    (io.StringIO, "1", True),  # asked for
    (Terminal, "0", False),
])
def test_bars_are_drawn_on_a_terminal_or_when_asked(stderr, setting, shown, tmp_path, monkeypatch):
    stream = stderr()
    monkeypatch.setattr("sys.stderr", stream)
    if setting is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, setting)
    sweep(tmp_path)
    assert ("cells done" in stream.getvalue()) == shown, stream.getvalue()


def test_training_piped_to_a_log_draws_no_bar(monkeypatch, capsys):
    from models.recall.config import RunConfig, TaskConfig, TrainConfig
    from models.recall.trainer import train

    monkeypatch.delenv(ENV, raising=False)
    run = RunConfig(TaskConfig(n_subjects=4, n_relations=2, answers_per_relation=2, n_noise=4, seq_len=4),
                    train=TrainConfig(steps=3, eval_every=1, eval_size=16, batch_size=16, device="cpu"))
    train(run, progress=True)
    assert capsys.readouterr().err == ""


def test_a_job_piped_to_a_log_writes_a_status_line_now_and_then(monkeypatch, capsys):
    """No bar in a log, but a plain line at most every STATUS_SECONDS (here: every update), and
    a last one when the job ends; nothing with FACTUAL_RECALL_PROGRESS=0 or --quiet."""
    from models.aot.config import AoTModelConfig, AoTTrainConfig
    from models.aot.trainer import train_aot
    from models.recall.config import RunConfig, TaskConfig, TrainConfig
    from models.recall.trainer import train
    from models.training import progress
    from tasks.association import AssociationTask

    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(progress, "STATUS_SECONDS", 0.0)
    run = RunConfig(TaskConfig(n_subjects=4, n_relations=2, answers_per_relation=2, n_noise=4, seq_len=4),
                    train=TrainConfig(steps=3, eval_every=1, eval_size=16, batch_size=16, device="cpu"))
    train(run, progress=True)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("training 1 model: 1/3 steps (33%), 0 s, about 0 s left, acc=")
    assert lines[-1].startswith("training 1 model: 3/3 steps (100%), 0 s, acc=") and len(lines) == 4
    assert "\r" not in "".join(lines)
    train_aot(AssociationTask(4, 2), [(AoTModelConfig(4, 1, 4), 0)],
              AoTTrainConfig(batch_size=8, batches=2, epochs=1, device="cpu"))
    assert capsys.readouterr().err.splitlines()[-1].startswith("training (1 model): 2/2 steps (100%), 0 s, mean_acc=")
    train(run, progress=False)
    monkeypatch.setenv(ENV, "0")
    train(run, progress=True)
    assert capsys.readouterr().err == ""


def test_a_short_job_writes_no_status_line(monkeypatch, capsys):
    from models.training.progress import progress_bar

    monkeypatch.delenv(ENV, raising=False)
    assert list(progress_bar(range(3), desc="snapshots")) == [0, 1, 2]  # well under STATUS_SECONDS
    assert capsys.readouterr().err == ""
