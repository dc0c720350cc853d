"""A real single-node SLURM cluster for tests: munged, slurmctld and slurmd on localhost, all state and config
under one temporary directory, ports chosen free. slurm-wlm and munge are installed with apt-get when missing
(root, as on CI). Every job is cancelled and every daemon stopped on the way out.

The node declares 8 CPUs, 16000 MB and 2 GPUs whatever the machine has (SlurmdParameters=config_overrides), so a
scheduler job and two worker groups fit on a 2-core machine. There are no GPUs here: the `gpu` GRES points at two
character devices made for the test (no GPU behind them); Slurm still allocates them and sets CUDA_VISIBLE_DEVICES.
Ordinary users can submit too: the config and munged's socket are reachable by everyone (as under /etc/slurm and
/run/munge), the munge key is root's alone.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path

SBIN = Path("/usr/sbin")
PACKAGES = ("slurm-wlm", "munge")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ensure_installed() -> None:
    if (SBIN / "slurmctld").exists() and (SBIN / "munged").exists() and shutil.which("sbatch"):
        return
    if os.geteuid() != 0:
        raise RuntimeError(f"SLURM tests need {' '.join(PACKAGES)}: apt-get install them (as root)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, capture_output=True, timeout=300)
    subprocess.run(["apt-get", "install", "-y", "-qq", *PACKAGES], check=True, env=env, capture_output=True,
                   timeout=600)


class LocalSlurm:
    def __init__(self, root: Path | None = None):
        # Not under pytest's 0700 temp root: users' sbatch must reach the config and munged's socket.
        self.root = root or Path(tempfile.mkdtemp(prefix="uni-agent-slurm-"))
        self.root.chmod(0o755)
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.pid_files = [self.root / "munge" / "munged.pid", self.root / "slurmctld.pid", self.root / "slurmd.pid"]

    def run(self, *command: str, check: bool = True, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(list(command), env=kwargs.pop("env", self.env), capture_output=True, text=True,
                              check=check, timeout=timeout, **kwargs)

    def start(self) -> None:
        ensure_installed()
        root = self.root
        for sub in ("munge", "munge-key", "spool/ctld", "spool/d", "log"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        (root / "munge").chmod(0o755)  # its socket: every user's sbatch asks munged for a credential
        (root / "munge-key").chmod(0o700)
        key = root / "munge-key" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        # Slurm drops GPUs without device files; character devices with /dev/null's numbers stand in for them, so
        # Slurm sets CUDA_VISIBLE_DEVICES for --gres=gpu:N jobs as on a GPU node.
        for i in range(2):
            device = root / f"fakegpu{i}"
            if not device.exists():
                os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        (root / "gres.conf").write_text(f"NodeName=localhost Name=gpu File={root}/fakegpu[0-1]\n")
        self.conf.write_text(f"""ClusterName=uatest
SlurmctldHost=localhost
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket.2
StateSaveLocation={root}/spool/ctld
SlurmdSpoolDir={root}/spool/d
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
SlurmctldTimeout=30
SlurmdTimeout=30
KillWait=5
GresTypes=gpu
NodeName=localhost NodeAddr=127.0.0.1 CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=16000 Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
PartitionName=short Nodes=localhost MaxTime=00:30:00 State=UP
""")
        self.conf.chmod(0o644)
        self.run(str(SBIN / "munged"), "-f", f"--socket={root}/munge/munge.socket.2", f"--key-file={key}",
                 f"--log-file={root}/log/munged.log", f"--pid-file={root}/munge/munged.pid",
                 f"--seed-file={root}/munge-key/munged.seed")
        self.run(str(SBIN / "slurmctld"), "-f", str(self.conf))
        self.run(str(SBIN / "slurmd"), "-f", str(self.conf), "-N", "localhost")
        self.wait_for(lambda: set(self.run("sinfo", "-h", "-o", "%t", check=False).stdout.split()) == {"idle"}, 60,
                      "the SLURM node to become idle")

    def wait_for(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout}s waiting for {what}\n{self.logs()}")
            time.sleep(0.2)

    def jobs(self) -> list[str]:
        out = self.run("squeue", "-h", "-o", "%i %j %T", check=False).stdout
        return [line for line in out.splitlines() if line.strip()]

    def cancel_all_and_wait(self, timeout: float = 60) -> None:
        for partition in ("debug", "short"):
            self.run("scancel", "--full", "--partition", partition, check=False)
        self.wait_for(lambda: not self.jobs(), timeout, "every job to leave the queue")

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                         for p in sorted((self.root / "log").glob("*.log")))

    def stop(self) -> None:
        try:
            self.cancel_all_and_wait()
        finally:
            for pid_file in reversed(self.pid_files):
                if not pid_file.exists():
                    continue
                pid = int(pid_file.read_text().split()[0])
                _terminate(pid)
            shutil.rmtree(self.root, ignore_errors=True)


def _terminate(pid: int, timeout: float = 15) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
                return
        except OSError:
            return
        time.sleep(0.1)
    if Path(f"/proc/{pid}").exists():
        os.kill(pid, signal.SIGKILL)
