"""The uni-agent sandbox supervisor: one small process per sandbox, started once, that runs all its commands.

It runs INSIDE the sandbox (bubblewrap, a container, a Modal sandbox), started as `python3 -I -S -c <this file's
source> STATE_DIR`, so it must run on any python3 >= 3.6 an image may have, with the standard library alone: no
third-party imports, no syntax newer than 3.6, nothing from the uni_agent package. That is also why it is one file
over 300 lines: its source is what the host sends, so it cannot import a helper module of its own.

Protocol (its stdin and stdout; its stderr is a diagnostic log only). Every message is one line of space-separated
fields, followed by the raw bytes whose lengths the line announces (no json: importing it, with `re`, would double
the supervisor's start-up time):
  host → supervisor  exec ID TIMEOUT MERGE CMD_LEN STDIN_LEN  cmd-bytes stdin-bytes   (STDIN_LEN -1: no stdin)
                     cancel ID                                kill the running command ID (its process group)
                     write ID APPEND PATH_LEN LEN  path-bytes data-bytes              write a file, no shell involved
  supervisor → host  ready PID PYTHON_VERSION                 once, at start
                     result ID EXIT|- TIMED_OUT CANCELLED OUT_LEN ERR_LEN DROPPED SECONDS  out-bytes err-bytes
                     failed ID LEN  message-bytes   the sandbox could not carry out request ID (its disk, its state
                                                    dir): an infrastructure failure, not the command's
Relay (a way out of a sandbox whose network is off, e.g. to the model gateway; only while the host asks for it):
  host → supervisor  listen ID PORT                 listen on 127.0.0.1:PORT (0: a free port); answer: listening ID
                                                    PORT, or failed ID ...
                     data CONN LEN  bytes           bytes for the program on connection CONN
                     close CONN                     the host sends no more on CONN
  supervisor → host  open CONN PORT                 a program connected to the listener on PORT; CONN numbers it
                     data CONN LEN  bytes           bytes the program sent on CONN
                     close CONN                     the program sends no more on CONN (it closed, or the socket broke)
Each side sends `close` once per connection (a half-close: the other direction goes on); the connection is gone when
both have. Data for a connection that is gone is dropped. Bytes for a program that does not read are buffered here.
A command runs as `bash run.sh` in a process group of its own (not a session: the kernel schedules each session as
an autogroup weighing as much as a whole process, so a session per command would let a burst of commands outweigh
everything else on the machine). At its timeout, or on cancel, that group is killed, nothing else. A command is over
when its shell exits: whatever it put in the background (`&`, `nohup`, `setsid`) keeps running until the sandbox
closes, and the output such processes write later is read and dropped, so they never block on a full pipe. The
working directory and exported variables carry over: run.sh saves them when the shell exits and the next command's
shell restores them; a command's environment is that state alone (so `unset` sticks), which starts as the
supervisor's own environment plus what the host appends at start. End of stdin ends the supervisor and every process
group it started (its owner is gone).
"""

import os
import select
import sys
import time

try:  # the C module: `signal`, `selectors` and `subprocess` import enum, re, collections and more, which doubled
    import _signal as signal  # the supervisor's start-up; this file uses only what C modules and `os` provide
except ImportError:
    import signal

CAPTURE_LIMIT_BYTES = 4 * 1024 * 1024  # per stream; the rest is counted, not kept (a `yes` must not eat memory)
READ_CHUNK = 65536
STATE_MARKER = "# uni-agent state end"
# Not at once: the commands of a wave end together (their model replies came together), and a shell started right
# away (~1.3 ms of CPU) would compete with the others' commands still running. Half a second later the burst is over,
# and the model's next reply, which the next command waits for, usually is not there yet; a command that comes sooner
# starts its own shell.
SPARE_SHELL_DELAY_S = 0.5
NOT_STATE = ("PWD", "OLDPWD", "SHLVL", "_")  # the shell's own bookkeeping, not the sandbox's environment

# One shell per command, started ahead of time: SPARE_SHELL_DELAY_S after the previous command ends, the next shell
# is started and restores that command's state (working directory, exported variables), then waits on its control
# pipe. When the command arrives it reads "go" or "merge" there (merge: stderr into stdout), sets the trap that saves
# the state on exit (also after `exit N`), and runs the command file. A shell never used (the state changed under it)
# reads end of file and exits without saving. The save goes to state.sh.new, checked for the end marker by the
# supervisor before it replaces state.sh, so a shell killed halfway through its save never leaves a broken state.
RUN_SCRIPT = r"""__ua_state=$UA_STATE; __ua_ctl=$UA_CTL; unset UA_STATE UA_CTL
[ -f "$__ua_state/state.sh" ] && source "$__ua_state/state.sh" 2>/dev/null
__ua_save_state() {
  local rc=$?
  { export -p; printf 'cd -- %q\n' "$PWD"; echo '# uni-agent state end'; } 2>/dev/null >"$__ua_state/state.sh.new"
  return $rc
}
IFS= read -r __ua_go <&"$__ua_ctl" || exit 0
exec {__ua_ctl}<&-
[ "$__ua_go" = merge ] && exec 2>&1
unset __ua_go
trap __ua_save_state EXIT
source "$0.cmd"
"""


class Poller:
    """What the supervisor needs of `selectors` (register, modify, unregister, select), on select.poll."""

    READ, WRITE = 1, 2

    def __init__(self):
        self.poll = select.poll()
        self.keys = {}  # fd -> Key

    def register(self, fileobj, events, data):
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        self.keys[fd] = Key(fileobj, events, data)
        self.poll.register(fd, (select.POLLIN if events & self.READ else 0) |
                           (select.POLLOUT if events & self.WRITE else 0))

    def modify(self, fileobj, events, data):
        self.unregister(fileobj)
        self.register(fileobj, events, data)

    def unregister(self, fileobj):
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        del self.keys[fd]
        self.poll.unregister(fd)

    def select(self, timeout):
        ready = []
        # Milliseconds rounded up: rounded down, a deadline less than 1 ms away would spin until it passed.
        for fd, flags in self.poll.poll(None if timeout is None else max(int(-(-timeout * 1000 // 1)), 0)):
            key = self.keys.get(fd)
            if key is None:
                continue
            # As selectors does: hang-up and error wake a reader and a writer alike, so each learns of it.
            events = (self.WRITE if flags & ~select.POLLIN else 0) | (self.READ if flags & ~select.POLLOUT else 0)
            if events & key.events:
                ready.append((key, events & key.events))
        return ready


class Key:
    def __init__(self, fileobj, events, data):
        self.fileobj = fileobj
        self.events = events
        self.data = data


class Child:
    """A shell in a process group of its own with its stdin, stdout and stderr on pipes. Started with posix_spawn (a
    vfork: a fork would copy this process's page tables and then fault on every page it writes while the child
    execs), else, before Python 3.8, with fork and exec."""

    def __init__(self, argv, env, pass_fd):
        ends = []
        try:
            for _ in range(3):
                ends.append(os.pipe())  # non-inheritable (PEP 446): exec closes every fd but 0-2 and pass_fd
            self.pid = self.spawn(argv, env, pass_fd, [ends[0][0], ends[1][1], ends[2][1]])
        except OSError:  # out of fds or processes: nothing of it stays open
            for fd in (fd for pair in ends for fd in pair):
                os.close(fd)
            raise
        self.returncode = None
        os.close(ends[0][0])
        os.close(ends[1][1])
        os.close(ends[2][1])
        self.stdin = os.fdopen(ends[0][1], "wb", buffering=0)
        self.stdout = os.fdopen(ends[1][0], "rb", buffering=0)
        self.stderr = os.fdopen(ends[2][0], "rb", buffering=0)

    @staticmethod
    def spawn(argv, env, pass_fd, stdio):
        # Python ignores these two; a command must not inherit that (`yes | head` ends `yes` with SIGPIPE).
        default = [getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ") if hasattr(signal, name)]
        if hasattr(os, "posix_spawn"):
            os.set_inheritable(pass_fd, True)  # only while spawning: the caller closes it right after
            try:
                return os.posix_spawn(argv[0], argv, env, setpgroup=0, setsigdef=default,
                                      file_actions=[(os.POSIX_SPAWN_DUP2, fd, target)
                                                    for target, fd in enumerate(stdio)])
            except NotImplementedError:  # a libc without it
                pass
            finally:
                os.set_inheritable(pass_fd, False)
        pid = os.fork()
        if pid == 0:
            try:
                os.setpgid(0, 0)
                for target, fd in enumerate(stdio):
                    os.dup2(fd, target)
                os.set_inheritable(pass_fd, True)
                for signum in default:
                    signal.signal(signum, signal.SIG_DFL)
                os.execve(argv[0], argv, env)
            finally:
                os._exit(127)
        return pid


class Shell:
    """A shell started ahead of its command: the process and the write end of its control pipe."""

    def __init__(self, proc, control_fd):
        self.proc = proc
        self.control_fd = control_fd


class Command:
    """One running command: its process, the output kept so far, and its deadline."""

    def __init__(self, request, proc, stdin_data):
        self.id = request["id"]
        self.proc = proc
        self.deadline = time.monotonic() + max(float(request["timeout"]), 0.001)
        self.started = time.monotonic()
        self.pending_stdin = stdin_data
        self.out = bytearray()
        self.err = bytearray()
        self.dropped = 0
        self.timed_out = False
        self.cancelled = False


class Supervisor:
    def __init__(self, state_dir, lifetime_s):
        self.state_dir = state_dir
        self.end_of_life = time.monotonic() + lifetime_s if lifetime_s > 0 else None
        self.run_script = os.path.join(state_dir, "run.sh")
        self.selector = Poller()
        self.inbox = bytearray()
        self.current = None
        self.spare = None  # the next command's shell, started ahead
        self.spare_due = None  # when to start it (monotonic), once a command has ended
        self.children = {}  # pid -> Popen of every shell not yet reaped
        self.groups = set()  # every command's process group, killed when the supervisor ends
        self.relay = None  # the Relay, once the host asks for one
        self.out = sys.stdout.buffer
        self.stdin_fd = sys.stdin.fileno()
        # SIGCHLD wakes the selector through a pipe: the loop notices a command's exit at once.
        self.wake_r = _wake_on_sigchld()
        os.set_blocking(self.stdin_fd, False)
        self.selector.register(self.stdin_fd, Poller.READ, ("inbox", None))
        self.selector.register(self.wake_r, Poller.READ, ("wake", None))

    # -- the loop ----------------------------------------------------------------------------------------------
    def serve(self):
        self.bash = _find("bash")
        if self.bash is None:
            raise RuntimeError("bash is not installed in the sandbox")
        os.makedirs(self.state_dir, exist_ok=True)
        with open(self.run_script, "w") as f:
            f.write(RUN_SCRIPT)
        with open(os.path.join(self.state_dir, "state.sh"), "w") as f:
            for key, value in sorted(os.environ.items()):
                if key not in NOT_STATE and key.replace("_", "a").isalnum() and not key[0].isdigit():
                    f.write("export %s=%s\n" % (key, _quote(value)))
        self.send("ready %d %d.%d.%d" % ((os.getpid(),) + tuple(sys.version_info[:3])))
        try:
            while True:
                deadlines = [t for t in (self.end_of_life, self.current and self.current.deadline, self.spare_due)
                             if t]
                timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
                if self.end_of_life is not None and time.monotonic() >= self.end_of_life:
                    sys.stderr.write("uni-agent supervisor: the sandbox's lifetime is over\n")
                    return
                for key, events in self.selector.select(timeout):
                    kind, command = key.data
                    if kind == "stream":
                        self.relay.ready(command, events)
                    elif kind == "listener":
                        self.relay.accept(command)
                    elif kind == "inbox":
                        if not self.read_inbox():
                            return
                    elif kind == "wake":
                        self.drain_wakeups()
                    elif kind == "stdin":
                        self.feed_stdin(command)
                    else:
                        self.read_output(key.fileobj, kind, command)
                self.check_current()
                self.start_spare_when_due()
        finally:
            for group in self.groups:
                self.kill_group(group)

    def read_inbox(self):
        try:
            chunk = os.read(self.stdin_fd, READ_CHUNK)
        except BlockingIOError:
            return True
        if not chunk:
            return False  # the host closed our stdin: the sandbox is being closed or its owner died
        self.inbox += chunk
        while self.handle_message():
            pass
        return True

    def handle_message(self):
        """Handle the first complete message in the inbox; False when there is none yet."""
        newline = self.inbox.find(b"\n")
        if newline < 0:
            return False
        fields = self.inbox[:newline].decode().split()
        op, request_id = fields[0], int(fields[1])
        if op == "cancel":
            del self.inbox[:newline + 1]
            if self.current is not None and self.current.id == request_id:
                self.current.cancelled = True
                self.kill_group(self.current.proc.pid)
            return True
        if op in ("listen", "close"):
            del self.inbox[:newline + 1]
            if self.relay is None:
                self.relay = Relay(self)
            if op == "close":
                self.relay.host_closed(request_id)
                return True
            try:
                self.relay.listen(request_id, int(fields[2]))
            except OSError as exc:  # the port is taken, say
                message = ("listen on 127.0.0.1:%s failed in the sandbox: %s" % (fields[2], exc)).encode()
                self.send("failed %d %d" % (request_id, len(message)), message)
            return True
        if op == "data":
            request = {"id": request_id}
            sizes = [int(fields[2]), 0]
        elif op == "exec":
            request = {"id": request_id, "timeout": float(fields[2]), "merge": fields[3] == "1"}
            stdin_size = int(fields[5])
            sizes = [int(fields[4]), max(stdin_size, 0)]
        elif op == "write":
            request = {"id": request_id, "append": fields[2] == "1"}
            sizes = [int(fields[3]), int(fields[4])]
        else:
            raise ValueError("unknown message %r" % (bytes(self.inbox[:newline]),))
        end = newline + 1 + sum(sizes)
        if len(self.inbox) < end:
            return False
        payload = bytes(self.inbox[newline + 1:end])
        del self.inbox[:end]
        first, rest = payload[:sizes[0]], payload[sizes[0]:]
        try:
            if op == "data":
                if self.relay is not None:
                    self.relay.deliver(request_id, first)
            elif op == "write":
                request["path"] = first.decode()
                self.write_file(request, rest)
            else:
                self.start(request, first, rest if stdin_size >= 0 else None)
        except OSError as exc:  # a full disk, a state dir removed: the sandbox failed this request, not the command
            message = ("%s failed in the sandbox: %s" % (op, exc)).encode()
            self.send("failed %d %d" % (request_id, len(message)), message)
        return True

    # -- commands ----------------------------------------------------------------------------------------------
    def start(self, request, command, stdin_data):
        if self.current is not None:
            raise RuntimeError("a command arrived while another one runs: the host sends one at a time")
        state_new = os.path.join(self.state_dir, "state.sh.new")
        if os.path.exists(state_new):
            os.unlink(state_new)
        with open(self.run_script + ".cmd", "wb") as f:
            f.write(command + b"\n")
        go = b"merge\n" if request.get("merge", True) else b"go\n"
        try:
            shell = self.hand_over(go)
        except OSError as exc:  # no shell could be started (the sandbox is at its process limit, say)
            message = "uni-agent: could not start a shell for the command: %s\n" % (exc,)
            self.send_line(request["id"], 126, False, False, message.encode(), b"", 0, 0.0)
            return
        proc = shell.proc
        current = self.current = Command(request, proc, stdin_data)
        for stream, kind in ((proc.stdout, "out"), (proc.stderr, "err")):
            os.set_blocking(stream.fileno(), False)
            self.selector.register(stream, Poller.READ, (kind, current))
        if stdin_data:
            os.set_blocking(proc.stdin.fileno(), False)
            self.selector.register(proc.stdin, Poller.WRITE, ("stdin", current))
        else:
            proc.stdin.close()  # the command reads end of file, as from /dev/null

    def hand_over(self, go):
        """Give the command to the shell started ahead (or a new one, if that one is gone) and return it."""
        shell, self.spare, self.spare_due = self.spare, None, None
        for _ in range(2):
            if shell is None:
                shell = self.start_shell()
            try:
                os.write(shell.control_fd, go)
                os.close(shell.control_fd)
                return shell
            except OSError:  # it died while waiting (killed from inside the sandbox): start another
                self.discard(shell)
                shell = None
        raise OSError("the shell died before it could take the command")

    def start_shell(self):
        """Start the next command's shell now, so that its start-up is not on the next command's round trip."""
        control_r, control_w = os.pipe()
        try:
            proc = Child([self.bash, "--noprofile", "--norc", self.run_script],
                         {"UA_STATE": self.state_dir, "UA_CTL": str(control_r)}, control_r)
        except OSError:
            os.close(control_w)
            raise
        finally:
            os.close(control_r)
        self.groups.add(proc.pid)
        self.children[proc.pid] = proc
        return Shell(proc, control_w)

    def discard(self, shell):
        """A shell that will not run a command (the state changed under it): it reads end of file and exits."""
        for fd_owner in (shell.proc.stdin, shell.proc.stdout, shell.proc.stderr):
            fd_owner.close()
        try:
            os.close(shell.control_fd)
        except OSError:
            pass

    def feed_stdin(self, command):
        stream = command.proc.stdin
        try:
            written = os.write(stream.fileno(), command.pending_stdin[:READ_CHUNK])
            command.pending_stdin = command.pending_stdin[written:]
        except BlockingIOError:
            return
        except OSError:  # the command closed its stdin or died: the rest of the input is not wanted
            command.pending_stdin = b""
        if not command.pending_stdin:
            self.selector.unregister(stream)
            stream.close()

    def read_output(self, stream, kind, command):
        """One read from a command's output pipe (the selector said it is readable)."""
        try:
            chunk = os.read(stream.fileno(), READ_CHUNK)
        except BlockingIOError:
            return False
        if not chunk:
            self.selector.unregister(stream)
            stream.close()
            return False
        if command is self.current:
            kept = command.out if kind == "out" else command.err
            room = max(CAPTURE_LIMIT_BYTES - len(kept), 0)
            kept += chunk[:room]
            command.dropped += len(chunk) - len(chunk[:room])
        # else: a background process of an earlier command: read so it never blocks, then dropped
        return True

    def drain_wakeups(self):
        _drain(self.wake_r)
        self.reap()

    def reap(self):
        """Reap every exited child: as a container's pid 1 the orphans of background processes come to us too."""
        for pid, status in _exited_children():
            child = self.children.pop(pid, None)
            if child is not None:
                child.returncode = _exit_code(status)
            self.forget_empty_groups()

    def forget_empty_groups(self):
        """Remember only the process groups that still have a process (what the command left in the background)."""
        for group in list(self.groups):
            if group in self.children:
                continue
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                self.groups.discard(group)
            except PermissionError:
                pass

    def check_current(self):
        command = self.current
        if command is None:
            return
        if command.proc.returncode is None and time.monotonic() >= command.deadline:
            command.timed_out = True
            self.kill_group(command.proc.pid)
            command.deadline = time.monotonic() + 1.0  # until it is reaped: again each second, not a busy loop
        if command.proc.returncode is None:
            return
        # The shell has exited. What it wrote is in the pipe already: read it all now. A stream still open after
        # that belongs to a process left in the background; it stays registered, read and dropped.
        for stream, kind in ((command.proc.stdout, "out"), (command.proc.stderr, "err")):
            while not stream.closed and self.read_output(stream, kind, command):
                pass
        if command.proc.stdin is not None and not command.proc.stdin.closed:
            self.selector.unregister(command.proc.stdin)
            command.proc.stdin.close()
        self.current = None
        if not (command.timed_out or command.cancelled):
            self.keep_state()
        self.send_result(command)
        self.spare_due = time.monotonic() + SPARE_SHELL_DELAY_S

    def start_spare_when_due(self):
        if self.spare_due is None or time.monotonic() < self.spare_due:
            return
        self.spare_due = None
        if self.spare is None and self.current is None:
            try:
                self.spare = self.start_shell()
            except OSError:
                self.spare = None  # the next command tries again

    def keep_state(self):
        new = os.path.join(self.state_dir, "state.sh.new")
        try:
            with open(new, "rb") as f:
                complete = f.read().rstrip().endswith(STATE_MARKER.encode())
        except OSError:
            return  # the command replaced its shell (`exec ...`): the previous state stays
        if complete:
            os.replace(new, os.path.join(self.state_dir, "state.sh"))

    def send_result(self, command):
        killed = command.timed_out or command.cancelled
        self.send_line(command.id, None if killed else command.proc.returncode, command.timed_out, command.cancelled,
                       bytes(command.out), bytes(command.err), command.dropped, time.monotonic() - command.started)

    def send_line(self, request_id, exit_code, timed_out, cancelled, out, err, dropped, seconds):
        self.send("result %d %s %d %d %d %d %d %.6f" % (
            request_id, "-" if exit_code is None else exit_code, timed_out, cancelled, len(out), len(err), dropped,
            seconds), out + err)

    def write_file(self, request, data):
        if self.spare is not None:  # it restored the state before this write: not to be used
            self.discard(self.spare)
            self.spare = None
        path = request["path"]
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        with open(path, "ab" if request.get("append") else "wb") as f:
            f.write(data)
        self.send_line(request["id"], 0, False, False, b"", b"", 0, 0.0)

    # -- plumbing ----------------------------------------------------------------------------------------------
    def send(self, line, payload=b""):
        self.out.write(line.encode() + b"\n" + payload)
        self.out.flush()

    def kill_group(self, pgid):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class Connection:
    """One connection a program made to a relay listener: what the host sent that the program has not read yet, and
    which directions are still open."""

    def __init__(self, conn_id, sock):
        self.id = conn_id
        self.sock = sock
        self.pending = bytearray()  # from the host, not yet taken by the program
        self.reading = True  # the program may still send (we sent no `close` yet)
        self.host_done = False  # the host sent `close`: shut our write side once `pending` is out
        self.shut = False
        self.broken = False  # a send failed: nothing more can reach the program
        self.mask = 0  # the selector events registered for it


class Relay:
    """The supervisor's end of the relay (see the protocol above): listeners on 127.0.0.1 inside the sandbox, and each
    connection's bytes carried as `data` messages on the supervisor's own stdin/stdout."""

    def __init__(self, supervisor):
        import socket  # here, not at the top: only a sandbox that relays pays for the import
        self.socket = socket
        self.supervisor = supervisor
        self.selector = supervisor.selector
        self.connections = {}
        self.last_id = 0

    def listen(self, request_id, port):
        socket = self.socket
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", port))
            listener.listen(128)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self.selector.register(listener, Poller.READ, ("listener", listener))
        self.supervisor.send("listening %d %d" % (request_id, listener.getsockname()[1]))

    def accept(self, listener):
        try:
            sock, _ = listener.accept()
        except OSError:  # gone before we took it, or out of file descriptors: the program sees a refused connect
            return
        sock.setblocking(False)
        sock.setsockopt(self.socket.IPPROTO_TCP, self.socket.TCP_NODELAY, 1)
        self.last_id += 1
        connection = self.connections[self.last_id] = Connection(self.last_id, sock)
        self.supervisor.send("open %d %d" % (connection.id, listener.getsockname()[1]))
        self.update(connection)

    def ready(self, connection, events):
        if events & Poller.READ:
            self.read(connection)
        if events & Poller.WRITE and connection.id in self.connections:
            self.flush(connection)

    def read(self, connection):
        try:
            chunk = connection.sock.recv(READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # reset by the program: nothing more in either direction
            chunk = b""
            connection.broken = True
            connection.pending = bytearray()
        if chunk:
            self.supervisor.send("data %d %d" % (connection.id, len(chunk)), chunk)
            return
        connection.reading = False
        self.supervisor.send("close %d" % connection.id)
        self.update(connection)

    def deliver(self, conn_id, data):
        connection = self.connections.get(conn_id)
        if connection is None or connection.broken or connection.host_done:
            return  # gone: dropped
        connection.pending += data
        self.flush(connection)

    def host_closed(self, conn_id):
        connection = self.connections.get(conn_id)
        if connection is not None:
            connection.host_done = True
            self.flush(connection)

    def flush(self, connection):
        if connection.pending and not connection.broken:
            try:
                sent = connection.sock.send(connection.pending)
                del connection.pending[:sent]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:  # the program is gone: what it did not read is dropped
                connection.broken = True
                connection.pending = bytearray()
        if connection.host_done and not connection.pending and not connection.shut and not connection.broken:
            try:
                connection.sock.shutdown(self.socket.SHUT_WR)
            except OSError:
                connection.broken = True
            connection.shut = True
        self.update(connection)

    def update(self, connection):
        """Wait for the events the connection still needs; close and forget it when both directions are over."""
        if not connection.reading and (connection.shut or connection.broken):
            if connection.mask:
                self.selector.unregister(connection.sock)
            connection.sock.close()
            del self.connections[connection.id]
            return
        mask = (Poller.READ if connection.reading else 0) | (
            Poller.WRITE if connection.pending and not connection.broken else 0)
        if mask == connection.mask:
            return
        if not mask:
            self.selector.unregister(connection.sock)
        elif connection.mask:
            self.selector.modify(connection.sock, mask, ("stream", connection))
        else:
            self.selector.register(connection.sock, mask, ("stream", connection))
        connection.mask = mask


def _find(program):
    for directory in os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(os.pathsep) + ["/usr/bin", "/bin"]:
        path = os.path.join(directory, program)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    return None


def _quote(value):
    """A shell word that is exactly `value` (single quotes; each ' as '\\'')."""
    return "'" + value.replace("'", "'\\''") + "'"


def _become(uid_gid):
    """Run as the image's User ("UID:GID"): the sandbox keeps only the capabilities to do this, and setuid to a
    non-zero uid drops them, so everything after runs as that user with no privileges at all."""
    if not uid_gid:
        return
    uid, gid = (int(x) for x in uid_gid.split(":"))
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


def _wake_on_sigchld():
    """The read end of a pipe that gets a byte at every SIGCHLD (both ends non-blocking), for a poll loop."""
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    return wake_r


def _drain(fd):
    """Read a non-blocking pipe empty."""
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _exited_children():
    """(pid, status) of each child that has exited, reaped one by one, until none is left."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, status


def _exit_code(status):
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)  # as a shell reports it
    return os.WEXITSTATUS(status)


def main():
    state_dir = sys.argv[1] if len(sys.argv) > 1 else "/run/uni-agent"
    lifetime_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    # The protocol owns fd 0 and 1; the commands never see them (their own stdin/stdout are pipes).
    try:
        _become(os.environ.pop("UNI_AGENT_RUN_AS", ""))
        Supervisor(state_dir, lifetime_s).serve()
    except Exception as exc:  # the host reads this from our stderr when the stream ends
        sys.stderr.write("uni-agent supervisor failed: %s: %s\n" % (type(exc).__name__, exc))
        sys.exit(70)


if __name__ == "__main__":
    main()
