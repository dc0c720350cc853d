"""What the benchmark measures besides wall time: CPU split into own vs. children, peak memory, system limits."""

from __future__ import annotations

import os
import resource
import threading
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Cpu:
    """CPU seconds a process spent itself (`own`) and in the children it waited for (`children`: here the sandboxed
    tool commands: unshare, mount, bwrap, bash and the command; plus git in sandbox start and patch collection)."""

    own: float = 0.0
    children: float = 0.0

    def __sub__(self, other: Cpu) -> Cpu:
        return Cpu(self.own - other.own, self.children - other.children)

    def __add__(self, other: Cpu) -> Cpu:
        return Cpu(self.own + other.own, self.children + other.children)


def cpu_now() -> Cpu:
    """This process's CPU (runs in the driver, and on every Dask worker through `client.run`)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return Cpu(me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime)


def machine_cpu_seconds() -> float:
    """CPU time the whole machine spent (user, nice, system; /proc/stat). Rusage misses part of a sandboxed command:
    bwrap's pid-namespace init is reaped by no one we wait for, so its CPU reaches no RUSAGE_CHILDREN."""
    with open("/proc/stat") as stat:
        user, nice, system = (int(x) for x in stat.readline().split()[1:4])
    return (user + nice + system) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def open_files(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


class PeakMemory:
    """Samples the summed RSS of some processes every `interval` seconds in a thread; `peak - baseline` is what the
    run added. Sampling /proc/<pid>/statm costs microseconds (it is counted in the driver's CPU). Also the most open
    files any one of them held (`peak_fds`), what the open-file estimate must cover."""

    def __init__(self, pids: list[int], interval: float = 0.5):
        self.pids, self.interval = list(pids), interval
        self.peak_fds = 0
        self.baseline = self.peak = self._sample()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="bench-peak-memory")

    def _sample(self) -> int:
        self.peak_fds = max([self.peak_fds, *(open_files(p) for p in self.pids)])
        return sum(rss_bytes(p) for p in self.pids)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self._sample())

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._sample())

    @property
    def added(self) -> int:
        return max(0, self.peak - self.baseline)


# Open files per rollout in flight, in the process that holds it (the soft limit is per process; children inherit
# it). Agent worker with real sandboxes: an HTTP connection, the sandbox's streams to its supervisor, a command's
# pipes and pidfd, files being written: 8 (an upper bound kept from before the fork server). Agent worker with the
# simulation's memory stand-in: its HTTP connection, 1.02 measured at 200 and 1,000 a worker (2: margin).
# Endpoint process: one socket per connection it serves, 1.03 measured (2: the kernel spreads connections over the
# processes unevenly). Each process also holds its libraries, Dask's sockets and logs: 1,024 (measured 25).
FDS_PER_ROLLOUT_SANDBOX, FDS_PER_ROLLOUT_SIMULATED, FDS_PER_CONNECTION, FDS_BASE = 8, 2, 2, 1024


def fds_needed(concurrency: int, workers: int, endpoint_processes: int = 1,
               per_rollout: int = FDS_PER_ROLLOUT_SANDBOX) -> int:
    """Open files the busiest process of a sweep point needs: a worker's share of the rollouts, or an endpoint
    process's share of the connections. E.g. 20,000 in flight on 10 workers and 4 endpoint processes: 17,024 with
    real sandboxes, 11,024 simulated."""
    per_worker = -(-concurrency // max(1, workers))
    per_endpoint = -(-concurrency // max(1, endpoint_processes))
    return max(per_rollout * per_worker, FDS_PER_CONNECTION * per_endpoint) + FDS_BASE


# Rollouts in flight one stand-in endpoint process answers on time: at 1,024 on 16 cores one process's replies left
# 8-17 ms late on average (up to 298 ms), four processes' 1.3-2.9 ms; 4-12 ms at 256 on 2 cores (docs/benchmarks.md,
# session 27).
ROLLOUTS_PER_ENDPOINT_PROCESS = 256


def endpoint_processes_for(concurrency: int) -> int:
    """The sweep's stand-in model processes at a point: one per ROLLOUTS_PER_ENDPOINT_PROCESS in flight, at most a
    quarter of the usable CPUs (they share the cores with the run), at least one."""
    return max(1, min(-(-concurrency // ROLLOUTS_PER_ENDPOINT_PROCESS), usable_cpus() // 4))


def fewest_processes(concurrency: int, limit: int, per_rollout: int = FDS_PER_ROLLOUT_SANDBOX) -> tuple[int, int]:
    """The fewest worker and endpoint processes whose busiest one fits under `limit` open files (the shape to ask
    for when the hard limit cannot be raised). E.g. 100,000 in flight under 20,000: 43 workers and 11 endpoint
    processes with real sandboxes, 11 and 11 simulated."""
    room = max(1, limit - FDS_BASE)
    rollouts_per_worker, connections_per_endpoint = max(1, room // per_rollout), max(1, room // FDS_PER_CONNECTION)
    return -(-concurrency // rollouts_per_worker), -(-concurrency // connections_per_endpoint)


def open_files_line(concurrency: int, workers: int, endpoint_processes: int, per_rollout: int) -> str:
    """What the estimate says for this shape, against the hard limit, and the fewest processes that fit under it."""
    need = fds_needed(concurrency, workers, endpoint_processes, per_rollout)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY:
        return f"open files: {need:,} per process at the busiest (no hard limit)"
    fit_workers, fit_endpoints = fewest_processes(concurrency, hard, per_rollout)
    return (f"open files: {need:,} per process at the busiest ({per_rollout} per rollout in flight in a worker, "
            f"{FDS_PER_CONNECTION} per connection in an endpoint process, + {FDS_BASE:,}); hard limit {hard:,}; "
            f"{concurrency:,} in flight fit under it with at least {fit_workers} worker and {fit_endpoints} endpoint "
            "processes")


def ensure_limits(concurrency: int, workers: int, endpoint_processes: int = 1,
                  per_rollout: int = FDS_PER_ROLLOUT_SANDBOX) -> list[str]:
    """Raise the soft open-file limit to what the sweep needs (children inherit it); fail early, saying what to do,
    when the hard limit is too low. Returns notes on what was changed."""
    notes = []
    need = fds_needed(concurrency, workers, endpoint_processes, per_rollout)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            fit_workers, fit_endpoints = fewest_processes(concurrency, hard, per_rollout)
            raise SystemExit(f"uni-agent bench: {concurrency:,} in flight on {workers} worker and {endpoint_processes} "
                             f"endpoint process(es) needs about {need:,} open files in the busiest process, but the "
                             f"hard limit (ulimit -Hn) is {hard:,}: ask for at least {fit_workers} workers "
                             f"(--workers) and {fit_endpoints} endpoint processes (--endpoint-processes), raise the "
                             "limit (limits.conf / systemd LimitNOFILE), or lower the rollouts in flight")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        notes.append(f"raised the open-file soft limit from {soft} to {need}")
    if os.geteuid() != 0:  # root is not bound by RLIMIT_NPROC
        # Each command is unshare → sh → bwrap → bwrap's init → bash; the endpoint holds a thread per connection.
        need_procs = 6 * concurrency + concurrency + 512
        soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
        if soft != resource.RLIM_INFINITY and soft < need_procs:
            if hard != resource.RLIM_INFINITY and hard < need_procs:
                raise SystemExit(f"uni-agent bench: concurrency {concurrency} needs about {need_procs} processes and "
                                 f"threads, but ulimit -Hu is {hard}: raise it or lower --concurrency")
            resource.setrlimit(resource.RLIMIT_NPROC, (need_procs, hard))
            notes.append(f"raised the process soft limit from {soft} to {need_procs}")
    return notes


PORT_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
# connect() takes the range's odd ports first and an even one only when every odd port is in use: past half the range
# each connect() walks all the odd ports (python -m uni_agent.bench.connect_cost: 19-41 us a connect() up to 46% of
# the range on the 2-core VM, 600-760 us from 53% on; at 100,000 in flight to one address the workers spent 57% of
# their CPU there). One address takes at most this share, just under the cliff.
PORT_FILL = 0.45


def port_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (first, last), shared by every process on this host."""
    try:
        low, high = (int(x) for x in Path(PORT_RANGE).read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    return low, high


def connections_per_address(fill: float = PORT_FILL) -> int:
    """How many connections this host holds open to one address and port before connect() gets expensive: each
    takes a local port from the kernel's ephemeral range (28,232 by default), and past half of it every new one
    searches the whole odd half first (PORT_FILL)."""
    low, high = port_range()
    return int((high - low + 1) * fill)


def endpoint_addresses(in_flight: int, fill: float = PORT_FILL) -> int:
    """Loopback addresses (127.0.0.1, .2, ...) the simulated endpoint listens on, so its connections fit the ports."""
    return max(1, -(-in_flight // connections_per_address(fill)))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def load_average() -> float:
    return os.getloadavg()[0]


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: `taskset -c 0,1` gives 2 on a 16-core machine), which the
    workers and sandboxes it starts inherit; os.cpu_count() is the machine's."""
    return len(os.sched_getaffinity(0))


def cpus_line() -> str:
    """'2 usable CPUs (of the machine's 16)', or '16 CPUs' when the process may use them all."""
    usable, machine = usable_cpus(), os.cpu_count() or 0
    return f"{usable} CPUs" if usable == machine else f"{usable} usable CPUs (of the machine's {machine})"


def record_counts(results_dir: Path, rollouts: int) -> dict[str, int]:
    """What a run's part files hold, read as they are (no deduplication, unlike the run's own reader): rows
    recorded, keys recorded more than once, and rollouts with no row."""
    import pyarrow.parquet as pq

    keys: list[tuple[str, int]] = []
    for part in sorted(results_dir.glob("part-*.parquet")):
        table = pq.read_table(part, columns=["instance_id", "rollout"])
        keys += zip(table["instance_id"].to_pylist(), table["rollout"].to_pylist())
    return {"recorded": len(keys), "duplicates": len(keys) - len(set(keys)), "lost": rollouts - len(set(keys))}


def ideal_makespan(rollouts: int, concurrency: int, llm_calls_per_rollout: int, delay_s: float) -> float:
    """The makespan if only the endpoint's delay took time: total work over the slots, never below one rollout."""
    per_rollout = llm_calls_per_rollout * delay_s
    return max(rollouts * per_rollout / concurrency, per_rollout)
