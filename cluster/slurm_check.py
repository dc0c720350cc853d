"""Will these SLURM jobs start? Before sbatch, a job's request is checked against its partition (`scontrol show
partition`: time, nodes, CPUs and memory per node) and the partition's nodes (`sinfo`: CPUs, memory, GPUs, state);
after it, the submitted jobs are watched for a pending reason that never resolves by itself (PartitionConfig,
ReqNodeNotAvail, a per-job QOS limit...). A job that cannot start otherwise waits in the queue forever, silently.

    python cluster/slurm_check.py fits LABEL [--script S.sbatch] [--flag cpus=--sandbox-cpus ...] -- SBATCH_OPTION...
    python cluster/slurm_check.py watch [--seconds 60] [--scheduler-job ID --scheduler-file F] JOBID...

`fits` exits 2 with the reasons when the job can never run there, 0 otherwise (printing what may keep it waiting);
`watch` exits 3 when a job cannot start or ended early, 0 once all run (or while they wait for normal reasons).
cluster/submit.sh and cluster/launch_jobqueue.py use both. Standard library only: it runs before any environment.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

UNLIMITED = ("UNLIMITED", "INFINITE", "NONE", "")
DEFAULT_FLAGS = {"cpus": "--cpus-per-task", "mem": "--mem", "gpus": "--gres=gpu:N", "time": "--time",
                 "nodes": "--nodes"}
# squeue reasons of a pending job that no amount of waiting resolves: the request or the account must change (or an
# administrator must act). "PerJob" limits (QOSMaxCpuPerJobLimit, AssocMaxWallDurationPerJobLimit...) belong here too.
NEVER_STARTS = {
    "PartitionConfig": "the job asks more than the partition's nodes have (CPUs, memory or GPUs per node)",
    "PartitionNodeLimit": "the job asks more nodes than the partition allows",
    "PartitionTimeLimit": "the job's --time is above the partition's MaxTime",
    "PartitionDown": "the partition is down",
    "PartitionInactive": "the partition is inactive",
    "ReqNodeNotAvail": "the nodes it needs are down, drained or reserved: it waits until an administrator returns them",
    "NodeDown": "a node it needs is down",
    "BadConstraints": "no node has the features (--constraint) it asks for",
    "DependencyNeverSatisfied": "the job it depends on failed or was cancelled",
    "InvalidAccount": "the account is not valid here (--account)",
    "InvalidQOS": "the QOS is not valid here (--qos)",
    "AccountNotAllowed": "the partition does not allow the account",
    "QOSNotAllowed": "the partition does not allow the QOS",
    "JobHeldAdmin": "an administrator holds it",
    "JobHeldUser": "it is held: `scontrol release <job id>`",
}
ENDED = {"FAILED", "CANCELLED", "TIMEOUT", "COMPLETED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
         "PREEMPTED", "SPECIAL_EXIT", "REVOKED"}


@dataclass
class Request:
    """What one job asks of each of its nodes (sbatch options, the last one of each kind winning, as in sbatch)."""
    partition: str | None = None
    nodes: int = 1
    cpus: int = 1  # per node: cpus-per-task x ntasks-per-node
    mem_mb: int | None = None  # per node; 0 = all of the node's memory; None = the partition's default
    gpus: int = 0  # per node
    time_min: float | None = None
    time_text: str = ""  # as asked


@dataclass
class Node:
    name: str
    cpus: int
    mem_mb: int
    gpus: int
    state: str

    @property
    def up(self) -> bool:
        return not re.search(r"down|drain|fail|maint|future|unknown|not_responding|\*", self.state, re.I)


def sbatch_lines(script: str) -> list[str]:
    """The options of a job script's #SBATCH lines (they come before the command line's, which override them)."""
    options = []
    for line in script.splitlines():
        if line.startswith("#SBATCH"):
            options += shlex.split(line[len("#SBATCH"):], comments=True)
        elif line.strip() and not line.startswith("#"):
            break  # sbatch stops reading directives at the first command
    return options


def parse_request(options: list[str]) -> Request:
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("-p", "--partition")
    p.add_argument("-N", "--nodes", default="1")
    p.add_argument("-c", "--cpus-per-task", type=int, default=1)
    p.add_argument("--ntasks-per-node", type=int, default=1)
    p.add_argument("--mem")
    p.add_argument("--mem-per-cpu")
    p.add_argument("--gres")
    p.add_argument("--gpus-per-node")
    p.add_argument("-t", "--time")
    known, _ = p.parse_known_args(options)
    gpus = gpu_count(known.gres or "") if known.gres else 0
    if known.gpus_per_node:
        gpus = int(known.gpus_per_node.split(":")[-1])
    cpus = known.cpus_per_task * known.ntasks_per_node
    mem = megabytes(known.mem) if known.mem else (megabytes(known.mem_per_cpu) * cpus if known.mem_per_cpu else None)
    return Request(partition=known.partition, nodes=int(known.nodes.split("-")[0]), cpus=cpus, mem_mb=mem, gpus=gpus,
                   time_min=minutes(known.time) if known.time else None, time_text=known.time or "")


def megabytes(text: str) -> int:
    """SLURM's memory sizes: a number in megabytes, or with K, M, G or T."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)B?", text.strip().upper())
    if not match:
        raise ValueError(f"not a SLURM memory size: {text!r}")
    return math.ceil(float(match.group(1)) * {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024**2}[match.group(2)])


def minutes(text: str) -> float | None:
    """SLURM's times (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S) in minutes; None for UNLIMITED."""
    if text.upper() in UNLIMITED:
        return None
    days, dash, rest = text.partition("-") if "-" in text else ("0", "", text)
    parts = [float(x) for x in rest.split(":")]
    if dash:  # D-H, D-H:M, D-H:M:S
        hours, mins, secs = (parts + [0.0, 0.0])[:3]
    elif len(parts) == 3:
        hours, mins, secs = parts
    else:  # M or M:S
        hours, mins, secs = 0.0, parts[0], (parts + [0.0])[1]
    return float(days) * 1440 + hours * 60 + mins + secs / 60


def size(mb: int) -> str:
    return f"{mb // 1024}G" if mb >= 1024 else f"{mb}M"


def clock(mins: float) -> str:
    days, rest = divmod(round(mins), 1440)
    return (f"{days}-" if days else "") + f"{rest // 60:02d}:{rest % 60:02d}:00"


def gpu_count(gres: str) -> int:
    """GPUs in a GRES string: 'gpu:2', 'gpu:a100:4(S:0-1)', 'gpu:1,shard:4'; 0 for '(null)'."""
    total = 0
    for item in re.sub(r"\([^)]*\)", "", gres).split(","):
        fields = item.split(":")
        if fields[0] == "gpu":
            total += int(fields[-1]) if len(fields) > 1 and fields[-1].isdigit() else 1
    return total


def _run(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout


def partition_info(name: str | None) -> dict[str, str]:
    """scontrol's fields of the partition (the default one when name is None); {} when there is none such."""
    done = subprocess.run(["scontrol", "show", "partition", "-o", *([name] if name else [])], capture_output=True,
                          text=True, timeout=30)
    if done.returncode != 0 and "not found" in done.stdout + done.stderr:
        return {}
    done.check_returncode()
    for line in done.stdout.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if name or fields.get("Default") == "YES":
            return fields
    return {}


def partition_nodes(name: str) -> list[Node]:
    nodes = {}
    for line in _run("sinfo", "-h", "-N", "-p", name, "-o", "%N|%c|%m|%G|%T").splitlines():
        node, cpus, mem, gres, state = line.split("|")
        nodes[node] = Node(node, int(cpus.rstrip("+")), int(mem.rstrip("+")), gpu_count(gres), state)
    return list(nodes.values())


def check(label: str, req: Request, part: dict[str, str], nodes: list[Node],
          flags: dict[str, str] | None = None) -> tuple[list[str], list[str]]:
    """(reasons it can never start, reasons it may wait) for a job asking `req` of the partition `part`."""
    flag = {**DEFAULT_FLAGS, **(flags or {})}
    name = part.get("PartitionName", req.partition or "?")
    where = f"partition {name}"
    never: list[str] = []
    wait: list[str] = []
    max_time = minutes(part.get("MaxTime", "UNLIMITED"))
    if req.time_min is not None and max_time is not None and req.time_min > max_time:
        never.append(f"{label} asks --time {req.time_text}; {where} allows at most {clock(max_time)}: "
                     f"pass {flag['time']} {clock(max_time)} or less")
    max_nodes = part.get("MaxNodes", "UNLIMITED")
    if max_nodes.isdigit() and req.nodes > int(max_nodes):
        never.append(f"{label} asks {req.nodes} nodes; {where} allows {max_nodes} per job: pass {flag['nodes']} "
                     f"{max_nodes} or less")
    max_cpus = part.get("MaxCPUsPerNode", "UNLIMITED")
    if max_cpus.isdigit() and req.cpus > int(max_cpus):
        never.append(f"{label} asks {req.cpus} CPUs per node; {where} allows {max_cpus}: pass {flag['cpus']} "
                     f"{max_cpus} or less")
    max_mem = part.get("MaxMemPerNode", "UNLIMITED")
    if req.mem_mb and max_mem.isdigit() and req.mem_mb > int(max_mem):
        never.append(f"{label} asks {size(req.mem_mb)} of memory per node; {where} allows {size(int(max_mem))}: "
                     f"pass {flag['mem']} {size(int(max_mem))} or less")
    if not nodes:
        never.append(f"{label}: {where} has no nodes")
        return never, wait
    fitting = [n for n in nodes if n.cpus >= req.cpus and (not req.mem_mb or n.mem_mb >= req.mem_mb)
               and n.gpus >= req.gpus]
    if len(fitting) < req.nodes:
        sizes = [("CPUs", req.cpus, max(n.cpus for n in nodes), flag["cpus"], str),
                 ("of memory", req.mem_mb or 0, max(n.mem_mb for n in nodes), flag["mem"], size),
                 ("GPUs", req.gpus, max(n.gpus for n in nodes), flag["gpus"], str)]
        too_big = [f"{label} asks {show(asked)} {what} per node; the largest node of {where} has {show(most)}"
                   + (f": pass {option} {show(most)} or less" if most else
                      " (a CPU-only cluster: --gpu-nodes 0; the llama.cpp engine then runs on the sandbox workers)")
                   for what, asked, most, option, show in sizes if asked > most]
        never += too_big or [f"{label} asks {req.nodes} nodes with {req.cpus} CPUs, {size(req.mem_mb or 0)} and "
                             f"{req.gpus} GPUs each; only {len(fitting)} node(s) of {where} have as much"]
    elif len([n for n in fitting if n.up]) < req.nodes:
        down = ", ".join(f"{n.name} ({n.state})" for n in fitting if not n.up)
        wait.append(f"{label}: the nodes of {where} big enough for it are not all up ({down}): it waits for them")
    if part.get("State", "UP") != "UP":
        wait.append(f"{label}: {where} is {part['State']}: jobs wait until an administrator brings it up")
    return never, wait


def fits(label: str, options: list[str], flags: dict[str, str]) -> int:
    req = parse_request(options)
    try:
        part = partition_info(req.partition)
        if not part:
            print(f"{label}: no partition {req.partition or '(default)'} (`sinfo -s` lists them)", file=sys.stderr)
            return 2
        nodes = partition_nodes(part["PartitionName"])
    except (OSError, subprocess.SubprocessError) as failed:
        print(f"warning: {label} not checked against the partition's limits: {failed}", file=sys.stderr)
        return 0
    never, wait = check(label, req, part, nodes, flags)
    for line in wait:
        print(f"warning: {line}", file=sys.stderr)
    for line in never:
        print(f"refused: {line}", file=sys.stderr)
    return 2 if never else 0


def never_starts(reason: str) -> str | None:
    """Why a pending job with this squeue reason will not start by waiting, or None when it may."""
    key = reason.split(",")[0]
    if key in NEVER_STARTS:
        return NEVER_STARTS[key]
    if "PerJob" in key or key.startswith("QOSMin"):
        return "a limit of the QOS or account on a single job"
    return None


def job_states(job_ids: list[str]) -> dict[str, tuple[str, str, str, str]] | None:
    """job id -> (name, state, reason, nodes); jobs slurmctld no longer knows are missing. None when squeue itself
    failed (slurmctld busy or restarting): ask again later rather than read every job as gone."""
    done = subprocess.run(["squeue", "-h", "--states=all", "-j", ",".join(job_ids), "-o", "%i|%j|%T|%r|%N"],
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        return {} if "Invalid job id" in done.stderr else None
    return {job: (name, state, reason, nodes) for job, name, state, reason, nodes in
            (line.split("|", 4) for line in done.stdout.splitlines() if line.count("|") == 4)}


def dashboard_port(scheduler_file: Path) -> int | None:
    try:
        return int(json.loads(scheduler_file.read_text())["services"]["dashboard"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def tunnel_hint(node: str, port: int | str) -> str:
    """How to reach a dashboard that listens on a compute node's loopback, from the user's own machine."""
    return (f"dashboard: on {node}'s loopback only; from your machine: ssh -J {socket.getfqdn()} "
            f"-L 8787:localhost:{port} {node}\n           then http://localhost:8787/status and "
            "http://localhost:8787/uni-agent (the driver prints the pages' addresses with their token)")


def watch(job_ids: list[str], seconds: float, scheduler_job: str | None, scheduler_file: Path | None) -> int:
    """Waits until every job runs (and the scheduler has written its file), one can never start, or `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        states = job_states(job_ids)
        if states is None:  # squeue did not answer: ask again, until the deadline
            if time.monotonic() > deadline:
                print(f"squeue did not answer; see `squeue -j {','.join(job_ids)}`", file=sys.stderr)
                return 0
            time.sleep(2)
            continue
        problems = []
        for job in job_ids:
            name, state, reason, _ = states.get(job, ("?", "ENDED", "", ""))
            why = never_starts(reason) if state == "PENDING" else None
            if why:
                problems.append(f"job {job} ({name}) cannot start: {reason}: {why}")
            elif state in ENDED or state == "ENDED":
                problems.append(f"job {job} ({name}) ended ({state}) before the cluster was up: see its log")
        if problems:
            for line in problems:
                print(f"WARNING: {line}", file=sys.stderr)
            print(f"         cancel with: scancel {' '.join(job_ids)}; then resubmit with sizes that fit",
                  file=sys.stderr)
            return 3
        running = all(states.get(job, ("", ""))[1] == "RUNNING" for job in job_ids)
        port = dashboard_port(scheduler_file) if scheduler_file else None
        if running and (scheduler_file is None or port is not None):
            print(f"running: {', '.join(f'{job} on {states[job][3]}' for job in job_ids)}")
            if scheduler_job and port is not None:
                print(tunnel_hint(states[scheduler_job][3], port))
            return 0
        if time.monotonic() > deadline:
            waiting = [f"{job} ({states[job][1].lower()}: {states[job][2]})" for job in job_ids if job in states
                       and states[job][1] != "RUNNING"]
            print(f"still waiting after {seconds:g} s: {', '.join(waiting) or 'the scheduler file'} (normal on a "
                  f"busy cluster: `squeue -j {','.join(job_ids)}`; the driver waits for the workers)")
            if scheduler_job:
                print(tunnel_hint("<the scheduler job's node>", "<its dashboard port, 8787 unless taken>"))
            return 0
        time.sleep(1)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    options: list[str] = []
    if "--" in argv:
        argv, options = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    fit = sub.add_parser("fits", help="check one job's sbatch options against its partition")
    fit.add_argument("label")
    fit.add_argument("--script", type=Path, help="its sbatch script: the #SBATCH lines come first")
    fit.add_argument("--flag", action="append", default=[], help="KIND=FLAG, to name the caller's flag in advice")
    wat = sub.add_parser("watch", help="wait for submitted jobs to run, or say why they cannot")
    wat.add_argument("job_ids", nargs="+")
    wat.add_argument("--seconds", type=float, default=60)
    wat.add_argument("--scheduler-job")
    wat.add_argument("--scheduler-file", type=Path)
    args = parser.parse_args(argv)
    if args.command == "fits":
        defaults = sbatch_lines(args.script.read_text()) if args.script else []
        return fits(args.label, defaults + options, dict(f.split("=", 1) for f in args.flag))
    return watch(args.job_ids, args.seconds, args.scheduler_job, args.scheduler_file)


if __name__ == "__main__":
    sys.exit(main())
