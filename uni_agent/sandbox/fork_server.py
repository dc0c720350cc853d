"""The worker's fork server: one bubblewrap process per worker process that forks its local sandboxes
(fork_server_main.py).

Starting a sandbox the plain way costs ~30 ms of CPU (a shell joining the pids cgroup, `setpriv`, `unshare`, a shell
and `mount` for the overlay, bwrap, a Python interpreter for the supervisor); a wave of 256 on 2 cores is then
seconds of nothing but starts. The fork server pays the interpreter and bwrap once: each sandbox is a fork of it that
unshares its own namespaces, mounts its own workspace and drops every capability (~3 ms). The isolation is the same
as bwrap's per sandbox (own mount, pid, network, ipc, uts and cgroup namespaces, read-only root, no capabilities,
no_new_privs, the same limits); see docs/sandboxes.md.

It serves sandboxes over the host's root with an overlay workspace, no network and no extra mounts (LocalSandbox
decides); the rest start the plain way. A fork server is probed once when it starts (a sandbox that must say ready):
where it cannot work (an old kernel, a locked-down /proc), the process says so once and starts every sandbox the plain
way. If the fork server dies, its sandboxes die with it (their supervisors' streams end: an infrastructure failure,
retried) and the next start makes a new one.
"""

from __future__ import annotations

import array
import atexit
import concurrent.futures
import json
import os
import select
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import structlog

from .bwrap import host_root_args, python_dirs_under_own_dirs
from .leftovers import OWNER_FILE, remove_sandbox_dir
from .private_dir import make_private_subdir
from .process_limit import ProcessLimit
from .repo import PACKAGE_DIR
from .supervisor_launch import SUPERVISOR_SOURCE

log = structlog.get_logger("uni_agent.sandbox")

FORK_SERVER_SOURCE = Path(__file__).with_name("fork_server_main.py").read_text()
FORK_SERVER_DIR = "/run/uni-agent-fork-server"  # fork_server_main.FORK_SERVER_DIR
PROBE_TIMEOUT_S = 30.0
FORK_SERVER_IDLE_S = 20.0  # a fork server with no sandbox for this long ends (the next start makes a new one, ~50 ms)
# The fork server's command line: its program and the supervisor's come on stdin (fork_server_main.py's main).
BOOT = ("import sys; SUPERVISOR_SOURCE, source = sys.stdin.read().split('\\0'); "
        "exec(compile(source, 'uni-agent-fork-server', 'exec'))")


class ForkServerClosed(OSError):
    """The fork server ended for idleness between the registry handing it out and the start: take a new one."""


@dataclass(frozen=True)
class ForkServerKey:
    """What a fork server binds: a sandbox needs a fork server whose views hold its dir, its task snapshot and its
    cgroup, and that runs at its CPU priority (`cpu_nice`: every sandbox of a fork server inherits the fork
    server's)."""

    sandboxes: Path
    repos: Path
    cgroups: Path | None
    nice: int = 0


class ForkServer:
    def __init__(self, key: ForkServerKey):
        self.key = key
        keep = python_dirs_under_own_dirs()
        config = {"keep": keep, "hide": [PACKAGE_DIR] if any(PACKAGE_DIR.startswith(d + "/") for d in keep) else [],
                  "nice": key.nice}
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = ["bwrap", "--unshare-user", "--uid", "0", "--gid", "0", "--unshare-ipc", "--unshare-pid",
                "--unshare-net", "--unshare-uts", "--die-with-parent", "--new-session", "--cap-add", "ALL",
                "--clearenv", *host_root_args(["--dir", "/tmp", "--dir", "/root"]),
                "--dir", f"{FORK_SERVER_DIR}/root", "--bind", str(key.sandboxes), f"{FORK_SERVER_DIR}/sandboxes",
                "--ro-bind", str(key.repos), f"{FORK_SERVER_DIR}/repos"]
        if key.cgroups is not None:
            argv += ["--bind", str(key.cgroups), f"{FORK_SERVER_DIR}/cgroup"]
        for index, path in enumerate(keep):
            argv += ["--ro-bind", path, f"{FORK_SERVER_DIR}/keep/{index}"]
        python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"
        argv += [python, "-I", "-S", "-c", BOOT, str(theirs.fileno()), json.dumps(config)]
        self.proc = _spawn_thread().submit(
            subprocess.Popen, argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            pass_fds=(theirs.fileno(),), start_new_session=True).result()
        theirs.close()
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(f"{SUPERVISOR_SOURCE}\0{FORK_SERVER_SOURCE}".encode())
            self.proc.stdin.close()
        except OSError:
            pass  # it ended at once: the probe says why
        self.control = ours
        self._send_lock = threading.Lock()
        self._state_lock = threading.Lock()  # _ended and _idle_timer
        self._ended: dict[str, concurrent.futures.Future[None]] = {}
        self._gone = False
        self._idle_timer: threading.Timer | None = None
        self.stderr_tail: list[str] = []
        threading.Thread(target=self._read_replies, name="fork-server-replies", daemon=True).start()
        threading.Thread(target=self._read_stderr, name="fork-server-stderr", daemon=True).start()

    @property
    def alive(self) -> bool:
        return not self._gone and self.proc.poll() is None

    def start(self, request: dict) -> tuple[int, int]:
        """Ask for one sandbox; the ends of its supervisor's stdin (to write) and stdout (to read)."""
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        with self._state_lock:
            if self._gone:  # ended for idleness since the caller took it from the registry
                for fd in (stdin_r, stdin_w, stdout_r, stdout_w):
                    os.close(fd)
                raise ForkServerClosed(f"fork server {self.proc.pid} has ended")
            if self._idle_timer is not None:
                self._idle_timer.cancel()
                self._idle_timer = None
            self._ended[request["name"]] = concurrent.futures.Future()
        try:
            self._send({"op": "start", **request}, [stdin_r, stdout_w])
        except OSError:
            self._ended.pop(request["name"], None)
            os.close(stdin_w)
            os.close(stdout_r)
            raise
        finally:
            os.close(stdin_r)
            os.close(stdout_w)
        return stdin_w, stdout_r

    def ended(self, name: str) -> concurrent.futures.Future[None]:
        """Done once the sandbox's pid 1 is gone, and with it every process of the sandbox (or the fork server is
        gone)."""
        future = self._ended.get(name)
        if future is None:
            future = concurrent.futures.Future()
            future.set_result(None)
        return future

    def kill(self, name: str) -> None:
        try:
            self._send({"op": "kill", "name": name})
        except OSError:
            pass  # the fork server is gone, and the sandbox with it

    def close(self) -> None:
        """End the fork server and every sandbox in it (they are its children's namespaces)."""
        self._gone = True
        try:
            self.control.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.control.close()

    def _close_if_idle(self) -> None:
        with _lock, self._state_lock:  # the registry's first, as fork_server_for takes them
            if self._ended or self._idle_timer is None:
                return  # a sandbox came meanwhile
            self._idle_timer = None
            self._gone = True  # a start that took this fork server before now asks for a new one (ForkServerClosed)
            if _fork_servers.get(self.key) is self:
                del _fork_servers[self.key]
        self.close()

    def _send(self, message: dict, fds: list[int] | None = None) -> None:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        with self._send_lock:
            self.control.sendmsg([json.dumps(message).encode()], ancillary)

    def _read_replies(self) -> None:
        try:
            while True:
                message = self.control.recv(1 << 16)
                if not message:
                    break
                reply = json.loads(message)
                with self._state_lock:
                    future = self._ended.pop(reply.get("name", ""), None)
                    if not self._ended and self._idle_timer is None:  # no sandbox left: it ends if none comes
                        self._idle_timer = threading.Timer(FORK_SERVER_IDLE_S, self._close_if_idle)
                        self._idle_timer.daemon = True
                        self._idle_timer.start()
                if reply.get("op") == "ended" and future is not None and not future.done():
                    future.set_result(None)
        except OSError:
            pass
        self._gone = True  # and every sandbox with it
        for future in list(self._ended.values()):
            if not future.done():
                future.set_result(None)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        with self.proc.stderr:
            for raw in self.proc.stderr:
                line = raw.decode("utf-8", "replace").rstrip()
                self.stderr_tail = (self.stderr_tail + [line])[-20:]
                log.warning("fork_server_stderr", pid=self.proc.pid, line=line[-2000:])

    def probe(self, env: dict[str, str]) -> str | None:
        """Start one empty sandbox (in a pids cgroup, where sandboxes get one) and wait for its supervisor's ready
        line; None if it came, else what went wrong."""
        name = f"fork-server-probe-{uuid.uuid4().hex[:8]}"
        # Made and removed as a sandbox's dir and cgroup are: a worker killed mid-probe leaves nothing the next
        # start's reap would not find.
        here = make_private_subdir(self.key.sandboxes, name, ("lower", "upper", "work", "merged", "tmp", "home",
                                                              "state"), {OWNER_FILE: str(os.getpid())})
        limit = ProcessLimit(name, 64 if self.key.cgroups is not None else None)
        stdin_w = stdout_r = -1
        try:
            limit.create()
            stdin_w, stdout_r = self.start({"name": name, "dir": name, "lower": f"sandboxes/{name}/lower",
                                            "workdir": "/testbed", "env": env, "as_bytes": 0, "nproc": 0,
                                            "cgroup": limit.cgroup.name if limit.cgroup is not None else ""})
            line = _read_line(stdout_r, PROBE_TIMEOUT_S)
            if not line.startswith(b"ready "):
                return (line.decode("utf-8", "replace").strip() or "no answer") + _tail(self.stderr_tail)
            return None
        except OSError as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            for fd in (stdin_w, stdout_r):
                if fd >= 0:
                    os.close(fd)
            try:
                self.ended(name).result(PROBE_TIMEOUT_S)
            except concurrent.futures.TimeoutError:
                self.kill(name)
            limit.remove()
            remove_sandbox_dir(here)


def _read_line(fd: int, timeout: float) -> bytes:
    data = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return data + b" (no answer within %d s)" % timeout
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0]


def _tail(lines: list[str]) -> str:
    return f"; fork server stderr: {' | '.join(lines[-5:])}" if lines else ""


def fork_server_stderr(fork_server: ForkServer) -> str:
    """The last lines the fork server wrote to its stderr, for an error message (empty if none)."""
    return _tail(fork_server.stderr_tail)


def fork_server_failure(key: ForkServerKey) -> str:
    """Why no fork server serves `key` here (its probe's failure)."""
    return _broken.get(key, "unknown")


_spawner: tuple[int, concurrent.futures.ThreadPoolExecutor] | None = None


def _spawn_thread() -> concurrent.futures.ThreadPoolExecutor:
    """The one thread (per process) that starts fork servers. bwrap's --die-with-parent is PR_SET_PDEATHSIG, which
    follows the thread that started it, not the process: a fork server started from an asyncio.to_thread worker was
    killed when that thread ended with its loop's asyncio.run (in tests, every test's first sandbox then met a fork
    server killed a moment before: "the sandbox's pid 1 in the fork server (gone) ended"). This thread ends with the
    process."""
    global _spawner
    if _spawner is None or _spawner[0] != os.getpid():
        _spawner = (os.getpid(), concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="uni-agent-fork-server"))
    return _spawner[1]


_fork_servers: dict[ForkServerKey, ForkServer] = {}
_broken: dict[ForkServerKey, str] = {}  # why a fork server cannot serve here, once its probe failed
_lock = threading.Lock()  # the registry's


def running_fork_server(key: ForkServerKey) -> ForkServer | None:
    """The live fork server for `key`, if there is one already (no wait)."""
    fork_server = _fork_servers.get(key)
    return fork_server if fork_server is not None and fork_server.alive else None


def fork_server_for(key: ForkServerKey, env: dict[str, str], *, quiet: bool = False) -> ForkServer | None:
    """The fork server for `key`, started (and probed) if needed; None where no fork server can serve (said once, in the
    log). Blocking: call it in a thread. `quiet` (a warm-up, before the run's logs are set up): its start is not
    announced, and a failed probe is neither said nor remembered (the first sandbox's start probes again and says
    it)."""
    with _lock:
        fork_server = _fork_servers.get(key)
        if fork_server is not None and fork_server.alive:
            return fork_server
        if key in _broken:
            return None
        if fork_server is not None:
            log.warning("fork_server_restarted", pid=fork_server.proc.pid, detail="the fork server had ended; a new "
                        "one starts (the sandboxes it held ended with it)" + _tail(fork_server.stderr_tail))
        fork_server = ForkServer(key)
        failure = fork_server.probe(env)
        if failure is not None:
            fork_server.close()
            if quiet:
                return None
            _broken[key] = failure
            log.warning("fork_server_unusable", detail="local sandboxes start one bwrap each (~30 ms of CPU, not ~3):"
                        f" the fork server does not work here: {failure}")
            return None
        _fork_servers[key] = fork_server
        if not quiet:
            log.info("fork_server_started", pid=fork_server.proc.pid, sandboxes=str(key.sandboxes))
        return fork_server


@atexit.register
def _close_fork_servers() -> None:
    for fork_server in list(_fork_servers.values()):
        fork_server.close()
