"""A user namespace of our own, for sandboxes started without root.

Mounting an overlay needs a mount namespace, which only root may make, except inside a user namespace of one's own
(`unshare --user --map-root-user --mount`, then `mount -t overlay`, allowed to ordinary users since Linux 5.11). In
it the caller is root: bubblewrap started there acts as it does for real root, and an image's rootfs is mounted
copy-on-write instead of copied. Two maps, the best this machine allows:

- subordinate ids (`--map-auto --map-root-user`): the caller is uid 0 and the first block of its /etc/subuid and
  /etc/subgid ranges is uid/gid 1..N (newuidmap and newgidmap, Debian's `uidmap` package, do the mapping). Images
  are unpacked inside this map, so their files keep their owners (uid 1234 in the image is 1234 in the sandbox, and
  subuid+1233 on the host), and an image's User can be switched to.
- root only (`--map-root-user`): no subordinate ids. The caller is uid 0 and no other id exists: every file of an
  image shows as root's, and an image whose User is not root cannot run (a clear error, not retried).

Files owned by subordinate ids cannot be removed by the caller outside the namespace (no write permission on the
directories they own): remove_tree removes what is left from inside it.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger("uni_agent.sandbox")

PROBE_TIMEOUT_S = 30
REMOVE_TIMEOUT_S = 600


@dataclass(frozen=True)
class UserNamespace:
    subordinate: bool  # other ids mapped too (owners kept, User switchable)
    ids: int  # how many uids are mapped from 0 (1: the caller alone)

    def argv(self, *, mount: bool) -> list[str]:
        """Put in front of a command: it runs as root of a fresh namespace with this map (and its own mounts)."""
        args = ["unshare", "--user", "--map-root-user"] + (["--map-auto"] if self.subordinate else [])
        if mount:
            args += ["--mount", "--propagation", "private"]
        return args + ["--"]

    def describe(self) -> str:
        if self.subordinate:
            return f"a user namespace mapping your uid to 0 and {self.ids - 1} subordinate ids to 1..{self.ids - 1}"
        return "a user namespace mapping your uid to 0 alone (no subordinate ids)"


def user_namespace(quiet: bool = False) -> UserNamespace | None:
    """The namespace rootless sandboxes run in; None for real root (none needed) and where the kernel refuses one.
    What is missing is said once in the log unless `quiet` (the fork server's warm-up, before a run's logs exist;
    its probe is the one the first sandbox then reuses)."""
    if os.geteuid() == 0:
        return None
    namespace, missing = _probed()
    if missing is not None and not quiet:
        _say(*missing)
    return namespace


@functools.cache
def _probed() -> tuple[UserNamespace | None, tuple[str, str] | None]:
    """The namespace, and what is missing (the log event and its detail) or None; once per process."""
    if shutil.which("unshare") is None:
        return None, None
    uid_map = _run(["unshare", "--user", "--map-root-user", "--map-auto", "--", "cat", "/proc/self/uid_map"])
    if uid_map is not None and _mapped_from_zero(uid_map) > 1:
        return UserNamespace(subordinate=True, ids=_mapped_from_zero(uid_map)), None
    if _run(["unshare", "--user", "--map-root-user", "--", "true"]) is not None:
        return UserNamespace(subordinate=False, ids=1), ("no_subordinate_ids", NO_SUBORDINATE_IDS)
    return None, ("no_user_namespace", "unprivileged user namespaces are refused here: local sandboxes copy their "
                  "trees instead of an overlay, and image sandboxes see your uid")


@functools.cache
def _say(event: str, detail: str) -> None:
    log.warning(event, detail=detail)


NO_SUBORDINATE_IDS = ("no subordinate ids for this user (an /etc/subuid and /etc/subgid entry, and newuidmap/"
                      "newgidmap from the uidmap package): image files show as root's inside sandboxes, and an image "
                      "whose User is not root cannot run")


def _run(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _mapped_from_zero(uid_map: str) -> int:
    """How many ids from 0 up are mapped without a gap (a /proc/PID/uid_map: inside, outside, count per line)."""
    ranges = sorted((int(inside), int(count)) for inside, _, count in
                    (line.split() for line in uid_map.strip().splitlines() if len(line.split()) == 3))
    end = 0
    for inside, count in ranges:
        if inside > end:
            break
        end = max(end, inside + count)
    return end


def remove_tree(path: str | os.PathLike[str]) -> None:
    """Remove a directory tree, also the parts that belong to subordinate ids (from inside the namespace)."""
    shutil.rmtree(path, ignore_errors=True)
    if not os.path.lexists(path):
        return
    namespace = user_namespace()
    if namespace is None:
        return  # real root removed what it could: what is left is in use or on a read-only mount
    # Inside, the caller is root over every mapped id: directories owned by subordinate ids, and overlayfs's work
    # dirs (mode 0), which the caller cannot enter outside, are removed like any other.
    subprocess.run([*namespace.argv(mount=False), "rm", "-rf", "--one-file-system", "--", str(Path(path))],
                   capture_output=True, timeout=REMOVE_TIMEOUT_S)
