"""The fork server: one process per worker process that forks every local sandbox of that worker.

It runs INSIDE bubblewrap (started by fork_server.py as `python3 -I -S -c BOOT CONTROL_FD CONFIG`, this source and the
supervisor's on its stdin, so that a sandbox's `ps` shows a short command line for its pid 1),
in a user namespace of its own where it keeps its capabilities. Per sandbox it forks a child that joins the
sandbox's pids cgroup and unshares every namespace (mount, pid, network, ipc, uts, cgroup); the child's own child
is the sandbox's pid 1: it builds the sandbox's root as bwrap would (a tmpfs of its own, the host's dirs read-only,
the workspace as an overlay over the task's git snapshot, its own /tmp and HOME, its state dir on that tmpfs, a fresh
/proc, /dev/shm and /dev/pts), pivots into it (the fork server's views of every other sandbox are left behind),
applies the limits, drops every capability for good (no_new_privs) and becomes the supervisor (supervisor.py, already
loaded here) on the pipes the worker passed in. A start costs two forks and a few dozen syscalls instead of a bwrap,
a shell, `mount` and a Python interpreter per sandbox (~3 ms against ~30 ms of CPU).

Like the supervisor it uses the standard library alone and runs on the host's python3 (>= 3.7). It never runs
anything from a sandbox: what it reads is the worker's control socket, which no sandbox can reach (its children
close every descriptor but their own pipes before the supervisor starts).

CPU priority: the fork server runs `nice` steps below the worker (CONFIG's "nice"), and every sandbox is a fork of it.
No sandbox, and no command in one, starts a session of its own (process groups instead): the kernel schedules each
session as an autogroup with the weight of a whole process, so 256 sandboxes as 256 sessions would outweigh the
worker, the scheduler and the driver 256 to 1. The fork server's own session (bwrap --new-session) is one autogroup for
all its sandboxes, set to the same nice.

Control protocol (a SOCK_SEQPACKET socket, one JSON object per message):
  worker → fork server   {"op": "start", "name", "dir", "lower", "workdir", "env", "as_bytes", "nproc", "cgroup"}
                 (dir: the sandbox's dir under sandboxes/, lower: the overlay's lower dir under FORK_SERVER_DIR, cgroup:
                 its pids cgroup under cgroup/ or "", as_bytes and nproc: RLIMIT_AS and RLIMIT_NPROC or 0)
                 with two pipe ends attached (SCM_RIGHTS): the supervisor's stdin and stdout
                 {"op": "kill", "name"}                       end that sandbox now (its pid namespace)
  fork server → worker   {"op": "ended", "name"}                      the sandbox's pid 1 is gone, and every process
  with it
End of file on the control socket (the worker is gone) ends every sandbox and the fork server.
"""

import array
import ctypes
import errno
import fcntl
import json
import os
import resource
import select
import signal
import socket
import struct
import sys

# Inside the fork server: the sandboxes' dirs, the task snapshots and the pids cgroups.
FORK_SERVER_DIR = "/run/uni-agent-fork-server"
STATE_DIR = "/run/uni-agent"
PROC_COVERED = ("sys", "sysrq-trigger", "irq", "bus")  # read-only in every sandbox's /proc
NEW_ROOT = FORK_SERVER_DIR + "/root"  # where a sandbox's root is built, in its own mount namespace, before pivot_root
OWN_DIRS = ("proc", "tmp", "root", "run")  # the fork server's are not bound: each sandbox gets its own
AUTOGROUP_RETRY_MS = 110  # the kernel takes one unprivileged autogroup change per 100 ms, machine-wide
AUTOGROUP_TRIES = 100
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217}.get(os.uname().machine, 155)

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS = 0x00020000, 0x02000000, 0x04000000
CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x08000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH = 2
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 1
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER = 24, 38, 36
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
LINUX_CAPABILITY_VERSION_3 = 0x20080522

libc = ctypes.CDLL(None, use_errno=True)


def _check(result, what):
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, "%s: %s" % (what, os.strerror(errno)))


def _mount(source, target, fstype, flags, data=None):
    enc = (lambda s: None if s is None else s.encode())
    _check(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           "mount %s on %s" % (fstype or source, target))


def _remount_read_only(path):
    """A bind remount keeps the flags it cannot clear (nosuid, nodev, noexec: locked by whoever mounted it)."""
    kept = 0
    flags = os.statvfs(path).f_flag
    for statvfs_bit, mount_bit in ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC)):
        if flags & statvfs_bit:
            kept |= mount_bit
    _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)


def _drop_capabilities():
    """Every capability gone for good: bounding set, ambient set, then effective/permitted/inheritable."""
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        _check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "drop capability %d" % cap)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(libc.capset(header, data), "capset")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    with open("/proc/self/status") as f:
        held = [line for line in f if line.startswith(("CapEff:", "CapPrm:", "CapBnd:", "CapAmb:"))]
    if any(int(line.split()[1], 16) for line in held):
        raise RuntimeError("capabilities still held after dropping them: %s" % " ".join(held))


def _plain_name(name):
    if not name or "/" in name or name in (".", ".."):
        raise ValueError("not a plain name: %r" % (name,))
    return name


def _become_sandbox(config, request, stdin_fd, stdout_fd):
    """In the sandbox's pid 1 (all namespaces new): build its root, limit it, drop privileges."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here shows in the fork server, nor the other way
    _build_root(config, request)
    _loopback_up()
    os.chdir(NEW_ROOT)
    _check(libc.syscall(SYS_PIVOT_ROOT, b".", b"."), "pivot_root")  # the fork server's root now lies under the new one
    _check(libc.umount2(b".", MNT_DETACH), "unmount the fork server's root")  # gone, with every view of the server
    os.chdir("/")
    _remount_read_only("/dev")
    if request.get("as_bytes"):
        resource.setrlimit(resource.RLIMIT_AS, (request["as_bytes"], request["as_bytes"]))
    if request.get("nproc"):
        resource.setrlimit(resource.RLIMIT_NPROC, (request["nproc"], request["nproc"]))
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["workdir"])
    _drop_capabilities()
    os.dup2(stdin_fd, 0)
    os.dup2(stdout_fd, 1)
    os.closerange(3, 1 << 16)  # above all the fork server's control socket: a sandbox must never reach it


def _build_root(config, request):
    """The sandbox's root at NEW_ROOT, as bwrap builds one: a tmpfs of its own (writable; gone with the sandbox) with
    the fork server's top-level dirs bound read-only (/usr, /etc, the Python's dirs), its own /tmp and HOME, its state
    dir on the tmpfs, the workspace (an overlay over the task's snapshot) at workdir, a fresh /proc, /dev/shm and
    /dev/pts."""
    here = os.path.join(FORK_SERVER_DIR, "sandboxes", _plain_name(request["dir"]))
    lower = os.path.join(FORK_SERVER_DIR, *[_plain_name(part) for part in request["lower"].split("/")])
    _mount("tmpfs", NEW_ROOT, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    for name in os.listdir("/"):
        source, target = "/" + name, os.path.join(NEW_ROOT, name)
        if os.path.islink(source):
            os.symlink(os.readlink(source), target)
        elif name not in OWN_DIRS and os.path.isdir(source):
            os.mkdir(target)
            _mount(source, target, None, MS_BIND | MS_REC)
            if name != "dev":
                _remount_read_only(target)
    for name in OWN_DIRS:
        os.mkdir(os.path.join(NEW_ROOT, name), 0o1777 if name == "tmp" else 0o755)
    merged = os.path.join(here, "merged")
    _mount_overlay(lower, os.path.join(here, "upper"), os.path.join(here, "work"), merged)
    # The supervisor's state dir (each command's saved shell state, rewritten after every command) on this root's
    # tmpfs, not bound from the sandbox's dir on the host's disk: no file on disk made and removed per command, and
    # the exported environment (secrets included) never reaches the disk.
    os.makedirs(NEW_ROOT + STATE_DIR, 0o700)
    for source, target in ((os.path.join(here, "tmp"), "/tmp"), (os.path.join(here, "home"), "/root"),
                           (merged, request["workdir"])):
        inside = NEW_ROOT + target
        if not os.path.isdir(inside):
            os.makedirs(inside)
        _mount(source, inside, None, MS_BIND | MS_REC)
    for index, path in enumerate(config["keep"]):  # the Python's dirs that /tmp or /root covered: shown again
        inside = NEW_ROOT + path
        if not os.path.isdir(inside):
            os.makedirs(inside)  # in the sandbox's own /tmp or HOME
        _mount(os.path.join(FORK_SERVER_DIR, "keep", str(index)), inside, None, MS_BIND | MS_REC)
        _remount_read_only(inside)
    for path in config["hide"]:
        _mount("tmpfs", NEW_ROOT + path, "tmpfs", MS_NOSUID | MS_NODEV, "size=4k,mode=0755")
    proc = NEW_ROOT + "/proc"
    _mount("proc", proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for name in PROC_COVERED:  # as bwrap covers them: the kernel's knobs are not the sandbox's to turn
        path = os.path.join(proc, name)
        if os.path.exists(path):
            _mount(path, path, None, MS_BIND | MS_REC)
            _remount_read_only(path)
    _mount("tmpfs", NEW_ROOT + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    _mount("devpts", NEW_ROOT + "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620")


def _mount_overlay(lower, upper, work, merged):
    """The workspace's overlay, `volatile` where the kernel has it (Linux 5.10 on; before, EINVAL: mounted without).
    Its upper layer goes with the sandbox, so no sync of it is worth waiting for: an fsync in the sandbox returns at
    once, and the unmount at the sandbox's end no longer syncs the whole filesystem under it to disk."""
    options = "lowerdir=%s,upperdir=%s,workdir=%s" % (lower, upper, work)
    try:
        _mount("overlay", merged, "overlay", 0, options + ",volatile")
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        _mount("overlay", merged, "overlay", 0, options)


def _loopback_up():
    """The sandbox's network namespace has only `lo`, and down: up, as bwrap does, so that a server started in one
    command answers the next one on 127.0.0.1."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))
    finally:
        sock.close()


def _sandbox_pid1(config, request, stdin_fd, stdout_fd, supervisor):
    try:
        _become_sandbox(config, request, stdin_fd, stdout_fd)
    except BaseException as exc:  # the worker reads this instead of the ready line
        message = "error the fork server could not set up the sandbox: %s: %s\n" % (type(exc).__name__, exc)
        try:
            os.write(stdout_fd, message.encode())
        finally:
            os._exit(71)
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    code = 0
    try:
        supervisor["Supervisor"](STATE_DIR, 0.0).serve()
    except BaseException as exc:
        sys.stderr.write("uni-agent supervisor failed: %s: %s\n" % (type(exc).__name__, exc))
        code = 70
    os._exit(code)


def _fork_sandbox(config, request, stdin_fd, stdout_fd, supervisor):
    """Start one sandbox: (the child that makes it, the read end of the pipe on which that child says its pid 1's
    pid, as the fork server sees it, then exits; nothing comes if the sandbox could not be made). The fork server does
    not wait for it: the unshare (a network namespace takes milliseconds) runs beside the next start."""
    pid_r, pid_w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(pid_r)
            os.setpgid(0, 0)  # a group of its own, not a session: see "CPU priority" above
            if request.get("cgroup"):  # joined before anything of the sandbox runs: all of it counts
                procs = os.path.join(FORK_SERVER_DIR, "cgroup", _plain_name(request["cgroup"]), "cgroup.procs")
                with open(procs, "w") as f:
                    f.write("0")
            _check(libc.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
                                | CLONE_NEWCGROUP), "unshare")
            pid1 = os.fork()
            if pid1 == 0:
                os.close(pid_w)
                _sandbox_pid1(config, request, stdin_fd, stdout_fd, supervisor)
            os.write(pid_w, str(pid1).encode())
            os._exit(0)
        except BaseException as exc:
            message = "error the fork server could not start the sandbox: %s: %s\n" % (type(exc).__name__, exc)
            try:
                os.write(stdout_fd, message.encode())
            finally:
                os._exit(71)
    os.close(pid_w)
    return child, pid_r


class ForkServerLoop:
    def __init__(self, config, control, supervisor):
        self.config = config
        self.control = control
        self.supervisor = supervisor
        self.pids = {}  # pid 1 of each live sandbox -> its name
        self.starting = {}  # read end of a starting sandbox's pid pipe -> its name
        self.makers = set()  # the children that make a sandbox and exit: reaped, not reported
        self.gone_early = set()  # pid 1s reaped before their pid came through the pipe
        self.kill_when_known = set()  # names asked to be killed while still starting
        self.poller = select.poll()
        self.wake_r = supervisor["_wake_on_sigchld"]()  # the supervisor's helpers: one copy of each

    def serve(self):
        self.poller.register(self.control.fileno(), select.POLLIN)
        self.poller.register(self.wake_r, select.POLLIN)
        nice = self.config.get("nice", 0)
        if nice:
            os.nice(nice)  # before the first fork: every sandbox inherits it
        autogroup_tries = AUTOGROUP_TRIES if nice else 0
        while True:
            if autogroup_tries:
                autogroup_tries = 0 if _set_autogroup_nice(nice) else autogroup_tries - 1
            for fd, _ in self.poller.poll(AUTOGROUP_RETRY_MS if autogroup_tries else None):
                if fd == self.wake_r:
                    self.reap()
                elif fd in self.starting:
                    self.started(fd)
                elif not self.handle_request():
                    return

    def handle_request(self):
        message, ancillary, _, _ = self.control.recvmsg(1 << 20, socket.CMSG_LEN(4 * 4))
        if not message:
            return False  # the worker is gone
        fds = array.array("i")
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
        request = json.loads(message.decode())
        name = request["name"]
        if request["op"] == "start":
            try:
                if len(fds) != 2:
                    self.send({"op": "ended", "name": name})
                    return True
                maker, pid_r = _fork_sandbox(self.config, request, fds[0], fds[1], self.supervisor)
            finally:
                for fd in fds:
                    os.close(fd)
            self.makers.add(maker)
            self.starting[pid_r] = name
            self.poller.register(pid_r, select.POLLIN)
        elif request["op"] == "kill":
            if name in self.starting.values():
                self.kill_when_known.add(name)
            for pid, known in list(self.pids.items()):
                if known == name:
                    self.kill(pid)
        return True

    def started(self, pid_r):
        """The maker said its sandbox's pid 1 (or closed the pipe without a word: no sandbox)."""
        name = self.starting.pop(pid_r)
        self.poller.unregister(pid_r)
        chunks = []
        while True:  # the maker writes a few bytes and exits: this does not wait long
            chunk = os.read(pid_r, 32)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(pid_r)
        data = b"".join(chunks)
        pid = int(data) if data else None
        if pid is None or pid in self.gone_early:
            self.gone_early.discard(pid)
            self.send({"op": "ended", "name": name})
            return
        self.pids[pid] = name
        if name in self.kill_when_known:
            self.kill_when_known.discard(name)
            self.kill(pid)

    def reap(self):
        self.supervisor["_drain"](self.wake_r)
        for pid, _ in self.supervisor["_exited_children"]():
            if pid in self.makers:
                self.makers.discard(pid)
                continue
            name = self.pids.pop(pid, None)
            if name is not None:
                self.send({"op": "ended", "name": name})
            else:  # a pid 1 whose pid is still in its pipe
                self.gone_early.add(pid)

    def send(self, message):
        try:
            self.control.send(json.dumps(message).encode())
        except OSError:
            pass  # the worker is gone: the loop ends at its end of file

    @staticmethod
    def kill(pid):
        try:
            os.kill(pid, signal.SIGKILL)  # pid 1 of its namespace: every process of the sandbox goes with it
        except ProcessLookupError:
            pass

    def end(self):
        for pid in list(self.pids):
            self.kill(pid)


def _set_autogroup_nice(nice):
    """Give this session's autogroup `nice`. True when done, or when there is nothing to do (a kernel without
    autogroups; where the cpu cgroup controller places us, autogroups do not apply); False: try again later."""
    try:
        fd = os.open("/proc/self/autogroup", os.O_WRONLY)
    except OSError:
        return True
    try:
        os.write(fd, str(nice).encode())
        return True
    except OSError as exc:
        return exc.errno != errno.EAGAIN
    finally:
        os.close(fd)


def main(supervisor_source):
    supervisor = {"__name__": "uni_agent_sandbox_supervisor"}
    exec(compile(supervisor_source, "uni-agent-supervisor", "exec"), supervisor)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the sources came on it
    os.close(null)
    control = socket.socket(fileno=int(sys.argv[1]))
    config = json.loads(sys.argv[2])  # {"keep": [dirs bound again over /tmp, /root], "hide": [dirs under a tmpfs],
    #                                     "nice": cpu_nice}
    _check(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "subreaper")  # the sandboxes' pid 1s stay ours
    fork_server = ForkServerLoop(config, control, supervisor)
    try:
        fork_server.serve()
    finally:
        fork_server.end()


if __name__ == "__main__":
    main(SUPERVISOR_SOURCE)  # noqa: F821 - BOOT (fork_server.py) defines it
