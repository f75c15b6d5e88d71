"""The executors' plumbing that needs no worker: the Ray address refused before Ray is asked
(a HOST:PORT nothing answers on would have ray.init retry for a minute), the Ray instance
started for this checkout, and the default count of worker processes."""
import logging
import os
import socket

import pytest

from analyses.sweeps import executors
from analyses.sweeps.executors import _check_reachable, default_jobs, start_ray


@pytest.fixture
def listening():
    """A port on this machine that accepts connections: HOST:PORT."""
    server = socket.create_server(("127.0.0.1", 0))
    yield f"127.0.0.1:{server.getsockname()[1]}"
    server.close()


def _closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as server:
        return server.getsockname()[1]


def test_an_address_is_taken_where_something_answers_and_refused_in_one_line_elsewhere(listening):
    _check_reachable("auto")  # Ray finds its cluster itself
    _check_reachable(listening)
    _check_reachable(f"ray://{listening}")  # Ray client's form
    port = _closed_port()
    with pytest.raises(ValueError) as refused:
        _check_reachable(f"127.0.0.1:{port}")
    assert str(refused.value) == f"--ray-address 127.0.0.1:{port}: no Ray cluster answers there (Connection refused)."
    for bad in ("127.0.0.1", ":6379", "127.0.0.1:port", "ray://:1"):
        with pytest.raises(ValueError) as refused:
            _check_reachable(bad)
        assert str(refused.value) == f"--ray-address {bad!r}: expected HOST:PORT (or auto)."
    with pytest.raises(ValueError, match=r"^--ray-address localhost:1:2: no Ray cluster answers there"):
        _check_reachable("localhost:1:2")  # the port after the last colon: the host "localhost:1" is not found


def test_ray_starts_for_this_checkout_quietly_with_a_worker_per_core_or_connects(monkeypatch):
    """Workers import this checkout (PYTHONPATH); no dashboard, no workers' logs in the
    driver's output; a local instance gets the cores asked for (default: every core), a
    cluster its own. A cluster that does not answer is one line."""
    import ray

    calls = []
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    start_ray(num_cpus=3)
    start_ray()
    start_ray("10.0.0.1:6379")
    env = {"env_vars": {"PYTHONPATH": f"{executors.ROOT}{os.pathsep}/elsewhere"}}
    common = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR, "runtime_env": env}
    assert calls == [{"address": None, "num_cpus": 3, **common},
                     {"address": None, "num_cpus": os.cpu_count(), **common},
                     {"address": "10.0.0.1:6379", "num_cpus": None, **common}]
    monkeypatch.delenv("PYTHONPATH")
    calls.clear()
    start_ray(num_cpus=1)
    assert calls[0]["runtime_env"] == {"env_vars": {"PYTHONPATH": str(executors.ROOT)}}

    def refuse(**kw):
        raise ConnectionError("Could not find any running Ray instance.\nPlease specify the one to connect to.")
    monkeypatch.setattr(ray, "init", refuse)
    with pytest.raises(ValueError) as refused:
        start_ray("10.0.0.1:6379")
    assert str(refused.value) == "--ray-address 10.0.0.1:6379: Could not find any running Ray instance."


def test_the_default_worker_processes_are_the_usable_cores_over_the_threads_of_a_cell(monkeypatch):
    cores = len(os.sched_getaffinity(0))
    assert [default_jobs(), default_jobs(1), default_jobs(2), default_jobs(10 ** 6)] == [
        cores, cores, max(1, cores // 2), 1]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(6)))  # the cores this process may use
    assert (default_jobs(), default_jobs(4)) == (6, 1)
    monkeypatch.delattr(os, "sched_getaffinity")  # macOS: every core
    monkeypatch.setattr(os, "cpu_count", lambda: 5)
    assert default_jobs(2) == 2
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # unknown: one
    assert default_jobs() == 1


def test_a_cell_computes_with_its_torch_threads_and_leaves_the_count_as_it_found_it():
    """What a worker runs (_run_cell: mutation testing sees it only when it runs in the test's
    own process), and the local executor: the cell's threads inside, the count restored after,
    an exception included."""
    import torch

    from analyses.sweeps.cells import Cell
    from analyses.sweeps.executors import LocalExecutor, _run_cell, torch_threads

    before = torch.get_num_threads()
    assert _run_cell(lambda a, b: {"sum": a + b, "threads": torch.get_num_threads()}, (2, 3), 3) == {
        "sum": 5, "threads": 3}
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError, match="a cell failed"), torch_threads(before + 1):
        assert torch.get_num_threads() == before + 1
        raise RuntimeError("a cell failed")
    assert torch.get_num_threads() == before
    local = LocalExecutor()
    assert local.running == 0 and local.threads == 1
    local.submit(Cell("c", lambda: {"threads": torch.get_num_threads()}, ()))
    assert local.running == 1 and local.finished()[1] == {"threads": 1} and local.running == 0
    assert torch.get_num_threads() == before
