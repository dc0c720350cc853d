"""The processes `uni-agent bench --simulate` runs and watches: a `dask scheduler` and `dask worker` processes as on a
SLURM allocation (ProcessCluster), and a sampler of their CPU, peak memory and the dashboard page's state (Sampler)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from ..dashboard import page_token
from ..dask_profiler import OFF_IN_ENVIRONMENT, profiler_kept
from ..dask_timers import environment as timers_environment
from ..driver.cluster import WORKER_PRELOAD
from ..driver.tls import CA_FILE, CERT_FILE, KEY_FILE, write_credentials
from ..private_dirs import dask_dir
from ..worker_preload import WARM_FORK_SERVER
from .lifetime import die_with_bench


class ProcessCluster:
    """A `dask scheduler` and `workers` `dask worker` processes (each with its nanny), as on a SLURM allocation: the
    workers load the worker preload as cluster/sandbox-workers.sbatch's do (without it, Dask's system monitor sampled
    every 0.5 s and the first wave paid for the imports), and all of it guarded as the job scripts guard theirs: TLS
    with credentials of its own (a scheduler without it runs what any local user sends it, as this user), a private
    scratch dir, Dask's profiler off. `env` gets what a driver needs to join it (the credentials' directory:
    UNI_AGENT_TLS_DIR, the tls_dir setting)."""

    def __init__(self, workers: int, work_dir: Path, env: dict[str, str], cwd: Path | None = None):
        self.tls_dir = work_dir / "tls"
        self.n, self.dir, self.cwd = workers, work_dir, cwd
        profiler = {} if profiler_kept() else dict([OFF_IN_ENVIRONMENT.split("=", 1)])
        self.env = {**env, "UNI_AGENT_TLS_DIR": str(self.tls_dir), "DASK_TEMPORARY_DIRECTORY": str(dask_dir()),
                    **profiler, **timers_environment(env),
                    WARM_FORK_SERVER: "0"}  # the simulation's sandboxes are stand-ins: no fork server to warm
        self.scheduler_file = work_dir / "scheduler.json"
        self.procs: dict[str, subprocess.Popen] = {}

    def _start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.dir / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        # Its own session (a worker is killed with its nanny at once; a Ctrl-C goes to the bench alone), and killed
        # by the kernel when the bench ends, however it ends.
        proc = subprocess.Popen([sys.executable, "-m", "dask", *args], env=self.env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, cwd=self.cwd,
                                preexec_fn=die_with_bench())
        self.procs[name] = proc
        return proc

    def __enter__(self) -> ProcessCluster:
        try:
            return self._start_all()
        except BaseException:  # a failed start (or a signal during it) stops what did start
            self.__exit__()
            raise

    def _start_all(self) -> ProcessCluster:
        self.dir.mkdir(parents=True, exist_ok=True)
        write_credentials(self.tls_dir)
        tls = ["--tls-ca-file", str(self.tls_dir / CA_FILE), "--tls-cert", str(self.tls_dir / CERT_FILE),
               "--tls-key", str(self.tls_dir / KEY_FILE)]
        self._start("scheduler", "scheduler", "--host", "127.0.0.1", "--port", "0", "--protocol", "tls", *tls,
                    "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(self.scheduler_file),
                    "--preload", "uni_agent.scheduler_preload")
        _wait(lambda: self.scheduler_file.exists(), 60, "the dask scheduler did not write its scheduler file")
        for i in range(self.n):
            self._start(f"worker-{i}", "worker", "--scheduler-file", str(self.scheduler_file), "--host", "127.0.0.1",
                        *tls, "--nthreads", "2", "--resources", "SANDBOX=100000", "--memory-limit", "0",
                        "--no-dashboard", "--name", f"sim-{i}", "--preload", WORKER_PRELOAD)
        from distributed import Client

        from ..driver.tls import file_security

        self.client = Client(scheduler_file=str(self.scheduler_file), timeout=60,
                             security=file_security(self.tls_dir))
        self.client.wait_for_workers(self.n, timeout=120)
        info = self.client.scheduler_info(n_workers=-1)
        self.dashboard = f"http://127.0.0.1:{info['services']['dashboard']}"
        pids = self.client.run(os.getpid)
        self.worker_pids = {w["name"]: pids[address] for address, w in info["workers"].items()}
        return self

    def kill_worker(self, name: str) -> None:
        """Worker and nanny both, at once (a node lost), so the nanny does not restart it."""
        proc = self.procs[f"worker-{name.split('-')[-1]}"]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.client.close()
        for name, proc in reversed(list(self.procs.items())):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            stop_session(proc, 30)


def stop_session(proc: subprocess.Popen, grace_s: float) -> None:
    """Waits `grace_s` for a process that was asked to stop, then kills its whole session (a nanny's worker too)."""
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _wait(ready, timeout: float, error: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(error)
        time.sleep(0.1)


class Sampler:
    """CPU seconds and peak RSS of named processes (psutil, every `interval` s, in a thread), and of the page's
    state: its size and build time inside the scheduler, and the events folded so far (run_on_scheduler)."""

    def __init__(self, client: Any, dashboard: str, interval: float = 1.0):
        import psutil

        self.psutil, self.client, self.dashboard, self.interval = psutil, client, dashboard, interval
        self.procs: dict[str, Any] = {}
        self.cpu0: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.peak_rss: dict[str, int] = {}
        self.peak_fds: dict[str, int] = {}  # open files: what the open-file estimate (measure.fds_needed) predicts
        self.page: list[dict[str, float]] = []  # one probe every few seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="sim-sampler")

    def watch(self, name: str, pid: int) -> None:
        with contextlib.suppress(self.psutil.Error):
            proc = self.psutil.Process(pid)
            times = proc.cpu_times()
            self.procs[name], self.cpu0[name] = proc, times.user + times.system
            self.cpu.setdefault(name, 0.0)

    def _sample(self) -> None:
        for name, proc in list(self.procs.items()):
            try:
                times, rss, fds = proc.cpu_times(), proc.memory_info().rss, proc.num_fds()
            except self.psutil.Error:  # gone (killed on purpose, or a driver that finished)
                self.procs.pop(name)
                continue
            self.cpu[name] = times.user + times.system - self.cpu0[name]
            self.peak_rss[name] = max(self.peak_rss.get(name, 0), rss)
            self.peak_fds[name] = max(self.peak_fds.get(name, 0), fds)

    def _loop(self) -> None:
        probes = 0
        while not self._stop.wait(self.interval):
            self._sample()
            probes += 1
            if probes % 5 == 0:
                with contextlib.suppress(Exception):
                    self.page.append(self.probe())

    def probe(self) -> dict[str, float]:
        figures = self.client.run_on_scheduler(page_probe)
        try:
            token = self.client.run_on_scheduler(page_token)
        except ModuleNotFoundError:  # --baseline: a tree from before the pages had a token serves them to anyone
            token = None
        headers = {"Authorization": f"Bearer {token}"} if token else {}  # the page needs the token
        request = urllib.request.Request(f"{self.dashboard}/uni-agent/api/state.json", headers=headers)
        started = time.perf_counter()
        with urllib.request.urlopen(request, timeout=30) as response:
            figures["http_bytes"] = len(response.read())
        figures["http_ms"] = (time.perf_counter() - started) * 1000
        figures["t"] = time.monotonic()
        return figures

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def page_probe(dask_scheduler: Any) -> dict[str, float]:
    """In the scheduler: build the page's state as its handler does, and count the events folded so far."""
    plugin = dask_scheduler.plugins.get("uni-agent-dashboard")
    if plugin is None:
        return {"events": 0, "state_bytes": 0, "build_ms": 0}
    started = time.perf_counter()
    body = plugin.state_json(None, 200)
    return {"events": plugin.state.totals.events, "state_bytes": len(body),
            "build_ms": (time.perf_counter() - started) * 1000, "rollouts_held": sum(
                len(r.rollouts) for r in plugin.state.runs.values())}

