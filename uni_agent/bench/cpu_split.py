"""The machine's CPU over a run, split by who spent it, read from /proc so that nothing hides in "the framework".

Roles: the driver (the bench process's threads but the scheduler's), the scheduler (the LocalCluster's IO-loop thread
in the same process: the scheduler and the nannies), the Dask workers (their own CPU), the sandboxes (every process
below a worker: bwrap, the supervisors, the commands, git), the endpoint, this sampler itself, and everything else
(the machine's /proc/stat total minus all of those: other users' work, kernel threads, and the last moments of
sandbox processes that no one we watch reaped).

Short-lived processes (a command lives milliseconds) are never seen by a sampler; their CPU reaches their parent's
"children" counters (cutime/cstime) when the parent reaps them. So a sandbox process counts its own and its reaped
children's CPU, a worker's children counters count for the sandboxes, and a process seen alive and later reaped by
a counted parent is taken off once, since its parent's counters now hold all of it. bwrap's inner processes outlive
their parent: pid 1 reaps them, out of every worker's counters (what rusage-based figures missed); a process once
seen below a worker stays a sandbox process, and what pid 1 reaped that was never seen alive is its own line. One pass over /proc a second
costs a few ms of CPU; it is reported as its own role, not hidden in the driver.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

ROLES = ("driver", "scheduler", "workers", "sandboxes", "endpoint", "sampler", "everything else")
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class _Seen:
    base: float  # its total (own + reaped children) when first seen; 0 when it started inside the window
    last: float
    parent: int


def _stat(path: str) -> tuple[int, float, float, float] | None:
    """(ppid, own CPU s, reaped children's CPU s, start time in ticks) of /proc/<pid>[/task/<tid>]/stat."""
    try:
        with open(path, "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    own = (int(fields[11]) + int(fields[12])) / _TICK
    children = (int(fields[13]) + int(fields[14])) / _TICK
    return int(fields[1]), own, children, float(fields[19])


def machine_seconds() -> float:
    with open("/proc/stat") as stat:
        user, nice, system = (int(x) for x in stat.readline().split()[1:4])
    return (user + nice + system) / _TICK


def _irq_seconds() -> float:
    with open("/proc/stat") as stat:
        fields = stat.readline().split()
    return (int(fields[6]) + int(fields[7])) / _TICK


def _boot_ticks_now() -> float:
    with open("/proc/uptime") as f:
        return float(f.read().split()[0]) * _TICK


@dataclass
class CpuSplit:
    """`with CpuSplit(driver_pid, scheduler_tids, worker_pids, endpoint_pids) as split:` ... `split.seconds`."""

    driver_pid: int
    scheduler_tids: list[int]
    worker_pids: list[int]
    endpoint_pids: list[int]
    interval: float = 1.0
    seconds: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._sandbox: dict[tuple[int, float], _Seen] = {}
        self._others: dict[tuple[int, float], tuple[str, float, float]] = {}  # key -> (label, base, last own CPU)
        self._gone = 0.0  # what vanished sandbox processes were seen holding, now in their parent's counters
        self._orphans_seen = 0.0  # the same for sandbox processes that pid 1 reaped
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="bench-cpu-split")
        self._sampler_cpu = 0.0

    def _fixed(self) -> dict[str, float]:
        """Own CPU so far of the long-lived processes and threads, and the workers' reaped children's."""
        out = dict.fromkeys(("driver", "scheduler", "workers", "worker_children", "endpoint"), 0.0)
        me = _stat(f"/proc/{self.driver_pid}/stat")
        out["driver"] = me[1] if me else 0.0
        for tid in self.scheduler_tids:
            thread = _stat(f"/proc/{self.driver_pid}/task/{tid}/stat")
            out["scheduler"] += thread[1] if thread else 0.0
        for pid in self.worker_pids:
            worker = _stat(f"/proc/{pid}/stat")
            if worker:
                out["workers"] += worker[1]
                out["worker_children"] += worker[2]
        for pid in self.endpoint_pids:
            endpoint = _stat(f"/proc/{pid}/stat")
            out["endpoint"] += (endpoint[1] + endpoint[2]) if endpoint else 0.0
        return out

    def _scan(self, window_start: float) -> None:
        """One pass over /proc: every process below a worker, its CPU so far; the ones gone since the last pass."""
        table: dict[int, tuple[int, float, float, float]] = {}
        for name in os.listdir("/proc"):
            if name.isdigit() and (stat := _stat(f"/proc/{name}/stat")) is not None:
                table[int(name)] = stat
        workers = set(self.worker_pids)
        below: dict[int, bool] = {}

        def is_below(pid: int) -> bool:
            chain = []
            while pid not in below:
                if pid in workers:
                    below[pid] = True
                    break
                entry = table.get(pid)
                if entry is None or pid <= 1:
                    below[pid] = False
                    break
                chain.append(pid)
                pid = entry[0]
            answer = below[pid]
            for p in chain:
                below[p] = answer
            return answer

        alive: set[tuple[int, float]] = set()
        known = {self.driver_pid, *workers, *self.endpoint_pids}
        for pid, (ppid, own, children, started) in table.items():
            if pid in known:
                continue
            key = (pid, started)
            # Once below a worker, always a sandbox process: bwrap's inner processes outlive their parent and
            # are reparented to pid 1, which reaps them (and what they reaped) where no worker's counters see it.
            if key not in self._sandbox and not is_below(pid):
                self._other(pid, ppid, own, started, window_start)
                continue
            alive.add(key)
            seen = self._sandbox.get(key)
            if seen is None:
                base = 0.0 if started >= window_start else own + children
                self._sandbox[key] = _Seen(base, own + children, ppid)
            else:
                seen.last, seen.parent = own + children, ppid
        countable = workers | {pid for pid, _ in self._sandbox}  # alive, or gone in this pass
        for key in [k for k in self._sandbox if k not in alive]:
            seen = self._sandbox.pop(key)
            self._finished.append(seen.last - seen.base)
            if seen.parent in countable:
                self._gone += seen.last  # its parent's children counters hold it now
            elif seen.parent == 1:
                self._orphans_seen += seen.last  # pid 1's children counters hold it now; counted here already

    def _other(self, pid: int, ppid: int, own: float, started: float, window_start: float) -> None:
        """A process outside every role: its own CPU, by name (what "everything else" is made of)."""
        key = (pid, started)
        seen = self._others.get(key)
        if seen is None:
            try:
                with open(f"/proc/{pid}/comm") as f:
                    name = f.read().strip()
            except OSError:
                return
            kernel = pid == 2 or ppid == 2
            label = ("kernel " if kernel else "") + name.split("/")[0].rstrip("0123456789:-_")
            self._others[key] = (label, 0.0 if started >= window_start else own, own)
        else:
            self._others[key] = (seen[0], seen[1], own)

    def breakdown(self, top: int = 6) -> list[tuple[str, float]]:
        """The largest parts of "everything else": CPU seconds by process name (kernel threads marked), what
        pid 1 reaped (orphans: processes whose parent was gone), and the interrupts (not in the machine's figure)."""
        by: dict[str, float] = {}
        for label, base, last in self._others.values():
            by[label] = by.get(label, 0.0) + last - base
        by["reaped by pid 1, not seen alive"] = self._init_children - self._orphans_seen
        parts = sorted(((k, v) for k, v in by.items() if v > 0), key=lambda kv: -kv[1])[:top]
        return parts + [("irq+softirq (not counted above)", self._irq)]

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            started = time.thread_time()
            self._scan(self._window_start)
            self._sampler_cpu += time.thread_time() - started

    def __enter__(self) -> CpuSplit:
        self._finished: list[float] = []
        self._window_start = _boot_ticks_now()
        self._machine0 = machine_seconds()
        self._irq0, self._init0 = _irq_seconds(), _stat("/proc/1/stat")
        self._fixed0 = self._fixed()
        self._scan(self._window_start)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._scan(self._window_start)
        fixed = self._fixed()
        machine = machine_seconds() - self._machine0
        init = _stat("/proc/1/stat")
        self._init_children = (init[2] - self._init0[2]) if init and self._init0 else 0.0
        self._irq = _irq_seconds() - self._irq0
        d = {k: fixed[k] - self._fixed0[k] for k in fixed}
        sandboxes = (d["worker_children"] + sum(self._finished)
                     + sum(s.last - s.base for s in self._sandbox.values()) - self._gone)
        split = {"driver": d["driver"] - d["scheduler"] - self._sampler_cpu, "scheduler": d["scheduler"],
                 "workers": d["workers"], "sandboxes": sandboxes, "endpoint": d["endpoint"],
                 "sampler": self._sampler_cpu}
        split["everything else"] = machine - sum(split.values())
        self.seconds = split
        self.machine_s = machine


def breakdown_line(parts: list[tuple[str, float]], turns: int) -> str:
    """'everything else, largest parts (ms per turn): kernel kworker 3.10, ...'."""
    return "everything else, largest parts (ms per turn): " + ", ".join(
        f"{name} {seconds / max(1, turns) * 1000:.2f}" for name, seconds in parts)


def split_line(seconds: dict[str, float], turns: int) -> str:
    """'machine CPU per turn X ms = driver a + scheduler b + ...' (ms per LLM call)."""
    per = {k: seconds.get(k, 0.0) / max(1, turns) * 1000 for k in ROLES}
    total = sum(per.values())
    parts = " + ".join(f"{k} {v:.2f}" for k, v in per.items())
    return f"machine CPU per turn {total:.2f} ms = {parts}"
