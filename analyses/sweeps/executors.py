"""Where a sweep's cells run (analyses.sweeps.cells): `local`, one after another in this process;
`processes`, in `--jobs` worker processes of this machine (spawned, so each may use CUDA:
one GPU shared by the workers); or `ray`, every cell a Ray task on a local Ray instance (one
worker per core) or on an existing cluster (`--ray-address`). On each, a cell computes with
`--torch-threads` torch threads (default 1), so its row does not depend on the executor. Ray
is an optional extra (`pip install -e '.[ray]'`) and is imported only when asked for.

An executor has submit(cell), finished() -> (cell, row) for one submitted cell that has
returned (blocking until one has), and `running`, the cells computing now."""
from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import threading
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from analyses.sweeps.cells import Cell

EXECUTORS = ("local", "processes", "ray")
RETRIES = 3  # times Ray re-runs a cell whose worker died (a cell that raises is not retried)
ROOT = Path(__file__).resolve().parents[2]  # the checkout the workers import this code from


@dataclass(frozen=True)
class ExecutorSettings:
    """Where a sweep's cells run (the flags --executor, --jobs, --ray-address, --gpus-per-cell).
    Settings this machine cannot run are refused (ValueError) when it is built, before
    anything runs or is written."""

    executor: str = field(default="local", metadata={
        "help": "local: one cell after another in this process | processes: cells in --jobs worker "
                "processes of this machine (on CUDA they share its GPU) | ray: every cell a Ray task"})
    jobs: int | None = field(default=None, metadata={
        "help": "with --executor processes: the worker processes, each computing one cell at a time "
                "(default: one per core this process may use, divided by --torch-threads)"})
    ray_address: str | None = field(default=None, metadata={
        "help": "with --executor ray: an existing Ray cluster, HOST:PORT (`ray start --head` prints it); "
                "default: start a local Ray instance with one worker per core"})
    gpus_per_cell: float | None = field(default=None, metadata={
        "help": "with --executor ray on CUDA: the GPU share each cell asks for (0.25: four cells per GPU)"})
    torch_threads: int = field(default=1, metadata={
        "help": "torch threads each cell computes with, on every executor (recorded with the sweep)"})

    def __post_init__(self):
        if isinstance(self.torch_threads, bool) or not isinstance(self.torch_threads, int) or self.torch_threads < 1:
            raise ValueError(f"--torch-threads must be an integer >= 1, got {self.torch_threads!r}.")
        if self.executor not in EXECUTORS:
            raise ValueError(f"unknown --executor {self.executor!r}: choose local, processes or ray.")
        if self.jobs is not None:
            if self.executor != "processes":
                raise ValueError("--jobs needs --executor processes.")
            if isinstance(self.jobs, bool) or not isinstance(self.jobs, int) or self.jobs < 1:
                raise ValueError(f"--jobs must be an integer >= 1, got {self.jobs!r}.")
        if self.executor != "ray":
            for flag, value in (("--ray-address", self.ray_address), ("--gpus-per-cell", self.gpus_per_cell)):
                if value is not None:
                    raise ValueError(f"{flag} needs --executor ray.")
            return
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ValueError("--executor ray needs Ray: pip install -e '.[ray]'.") from None
        if self.gpus_per_cell is not None:
            if not self.gpus_per_cell > 0:
                raise ValueError(f"--gpus-per-cell must be > 0, got {self.gpus_per_cell}.")
            import torch

            if self.ray_address is None and not torch.cuda.is_available():
                raise ValueError("--gpus-per-cell needs CUDA, and this machine has no CUDA device.")
        if self.ray_address is not None:
            _check_reachable(self.ray_address)


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Refuse a HOST:PORT nothing answers on (ray.init would retry for a minute)."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--ray-address {address!r}: expected HOST:PORT (or auto).")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise ValueError(f"--ray-address {address}: no Ray cluster answers there ({e.strerror or e}).") from None


@contextmanager
def open_executor(settings: ExecutorSettings):
    """The executor `settings` ask for; a Ray instance or worker processes this started are
    shut down on leaving."""
    if settings.executor == "local":
        yield LocalExecutor(settings.torch_threads)
        return
    if settings.executor == "processes":
        executor = ProcessExecutor(settings.jobs or default_jobs(settings.torch_threads), settings.torch_threads)
        try:
            yield executor
        except BaseException:
            executor.close(kill=True)  # the sweep stops: cells still computing are not waited for
            raise
        executor.close()
        return
    import ray

    started = not ray.is_initialized()
    if started:
        start_ray(settings.ray_address)
    try:
        if settings.gpus_per_cell is not None and not ray.cluster_resources().get("GPU"):
            raise ValueError("--gpus-per-cell: the Ray cluster has no GPU.")
        yield RayExecutor(settings.gpus_per_cell or 0, settings.torch_threads)
    finally:
        if started:
            ray.shutdown()


def start_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Connect to the cluster at `address`, or start a local Ray instance with `num_cpus`
    workers (default: one per core). Workers import this checkout's code."""
    import logging

    import ray

    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    try:
        ray.init(address=address, num_cpus=None if address else (num_cpus or os.cpu_count()),
                 include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR,
                 runtime_env={"env_vars": {"PYTHONPATH": path}})
    except ConnectionError as e:
        raise ValueError(f"--ray-address {address}: {str(e).splitlines()[0]}") from None


class LocalExecutor:
    """Cells run in this process, in the order they were submitted, each with `threads`
    torch threads (the process's own count is restored after each)."""

    def __init__(self, threads: int = 1):
        self.queue: deque[Cell] = deque()
        self.threads = threads

    @property
    def running(self) -> int:
        return min(1, len(self.queue))

    def submit(self, cell: Cell) -> None:
        self.queue.append(cell)

    def finished(self) -> tuple[Cell, dict]:
        cell = self.queue.popleft()
        with torch_threads(self.threads):
            return cell, cell.fn(*cell.args)


def default_jobs(threads: int = 1) -> int:
    """Worker processes by default: the cores this process may use, `threads` per cell."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // threads)


class ProcessExecutor:
    """Cells run in `jobs` worker processes of this machine, each with `threads` torch
    threads. The workers are spawned (not forked), so each may use CUDA, and import this
    checkout's code (a spawned process starts with this one's sys.path). A cell that raises
    stops the sweep with its error; a worker that dies (killed, out of memory) stops it with
    an error saying so; either way the cells finished before are recorded and the cells
    still computing are not waited for (open_executor kills the workers)."""

    def __init__(self, jobs: int, threads: int = 1):
        self.jobs, self.threads = jobs, threads
        self.pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))
        self.in_flight: dict[Future, Cell] = {}

    @property
    def running(self) -> int:
        return min(self.jobs, len(self.in_flight))

    def submit(self, cell: Cell) -> None:
        with _ctrl_c_held():  # a worker started here never sees Ctrl-C: the sweep stops, and stops the workers
            self.in_flight[self.pool.submit(_run_cell, cell.fn, cell.args, self.threads)] = cell

    def finished(self) -> tuple[Cell, dict]:
        done, _ = wait(self.in_flight, return_when=FIRST_COMPLETED)
        future = min(done, key=lambda f: f.exception() is not None)  # a returned cell before a failed one
        cell = self.in_flight.pop(future)
        try:
            return cell, future.result()
        except BrokenProcessPool:
            raise RuntimeError(f"a worker process died (killed, or out of memory); cells unfinished: "
                               f"{len(self.in_flight) + 1}, the finished ones are recorded: the same command "
                               "resumes.") from None
        except (ValueError, OSError) as e:  # bad input: one line, as in this process
            raise e from None

    def close(self, kill: bool = False) -> None:
        """Stop the workers: when idle, or at once (`kill`), dropping the cells in flight."""
        if kill:
            for process in list(self.pool._processes.values()):  # no public way before Python 3.14
                process.kill()
        self.pool.shutdown(wait=True, cancel_futures=True)


@contextmanager
def _ctrl_c_held():
    """SIGINT blocked inside, in this thread and in every process started here (a spawned
    worker inherits the mask); one that arrived meanwhile is raised on leaving. A Ctrl-C then
    interrupts this process alone, which kills the workers (open_executor): no worker prints
    its own traceback or leaves a semaphore behind."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


class RayExecutor:
    """Every cell a Ray task asking for one CPU (and `gpus` of a GPU), computing with
    `threads` torch threads; a cell whose worker dies is re-run by Ray (RETRIES times); one
    that raises stops the sweep with its error."""

    def __init__(self, gpus: float = 0.0, threads: int = 1):
        import ray

        self.ray, self.threads = ray, threads
        self.task = ray.remote(_run_cell).options(num_cpus=1, num_gpus=gpus, max_retries=RETRIES)
        self.slots = int(ray.cluster_resources().get("CPU", 1))
        if gpus:
            self.slots = min(self.slots, int(ray.cluster_resources().get("GPU", 0) / gpus))
        self.in_flight: dict = {}  # ObjectRef -> Cell

    @property
    def running(self) -> int:
        return min(self.slots, len(self.in_flight))

    def submit(self, cell: Cell) -> None:
        self.in_flight[self.task.remote(cell.fn, cell.args, self.threads)] = cell

    def finished(self) -> tuple[Cell, dict]:
        (ref,), _ = self.ray.wait(list(self.in_flight), num_returns=1)
        cell = self.in_flight.pop(ref)
        try:
            return cell, self.ray.get(ref)
        except self.ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, (ValueError, OSError)):  # bad input: one line, as in this process
                raise e.cause from None
            raise


def _run_cell(fn, args: tuple, threads: int) -> dict:
    """A cell on a worker (a Ray task or a worker process), with `threads` torch threads."""
    with torch_threads(threads):
        return fn(*args)


@contextmanager
def torch_threads(n: int):
    """torch computes with `n` threads inside; the count before is restored on leaving."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
