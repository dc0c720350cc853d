"""Container images as root filesystems for the local sandbox: fetched once per node, unpacked once, shared read-only.

An image reference is one of
- `oci:PATH[:TAG]`: an OCI image layout directory (`podman save --format oci-dir`, `skopeo copy ... oci:PATH`);
- `oci-archive:PATH[:TAG]`: the same as one tar file (`podman save --format oci-archive`);
- `docker-archive:PATH`: a `docker save` / `podman save` tarball (manifest.json and one tar per layer);
- a plain path: a layout directory or either kind of archive, told apart by what is in it;
- anything else: a registry reference (`docker.io/swebench/sweb.eval...:latest`), copied with `skopeo` where it is
  installed, or taken from the local podman store where podman has it (`podman save`).

Each image is unpacked by `umoci` (whiteouts, opaque directories, hard links, owners and modes, digests checked)
into `<cache>/<manifest digest>/rootfs`, under an exclusive file lock on that digest, so concurrent workers on one
node unpack it once and the others wait for it. Without root it is unpacked inside the user namespace the sandboxes
run in (userns.py), so that its files keep their owners there; with no subordinate ids, by `umoci --rootless` (every
file the caller's, so root's inside). The three kinds of unpack go to dirs of their own (suffixes `-subids`,
`-rootless`). A sandbox holds a shared lock on the image for as long as it runs; the cache evicts the least
recently used images beyond its size limit, skipping those in use. The cache belongs on node-local disk:
`UNI_AGENT_IMAGE_CACHE` (default `~/.cache/uni-agent/images`), `UNI_AGENT_IMAGE_CACHE_GB` (100).

Pre-pull the images a dataset names, e.g. in a SLURM job's prologue:
`python -m uni_agent.sandbox.image_store pull --dataset data.parquet` (or image references as arguments).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .image_sources import ImageError, Source, StagedLayout, blob_path, parse_reference, read_json, run_tool
from .userns import remove_tree, user_namespace

DEFAULT_CACHE = Path.home() / ".cache" / "uni-agent" / "images"
DEFAULT_CACHE_GB = 100.0
META = "image.json"  # written last: an image dir without it is not unpacked


@dataclass(frozen=True)
class ImageRootfs:
    """An unpacked image: its root filesystem and what its config says a process starts with."""

    reference: str
    digest: str  # the manifest's, `sha256:...`
    rootfs: Path
    env: tuple[str, ...]  # the image config's Env, `KEY=value`
    workdir: str  # its WorkingDir, "" when unset
    uid: int  # its User, resolved against the image's /etc/passwd and /etc/group by umoci
    gid: int
    home: str  # that user's home directory, from the image's /etc/passwd
    size_bytes: int

    def env_dict(self) -> dict[str, str]:
        return dict(item.split("=", 1) for item in self.env if "=" in item)


class ImageLease:
    """A sandbox's hold on an image: while it is open, the image is not evicted."""

    def __init__(self, image: ImageRootfs, fd: int, unpacked: bool):
        self.image, self._fd, self.unpacked = image, fd, unpacked

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # drops the shared lock
            self._fd = -1


class ImageStore:
    """The node's cache of unpacked images."""

    def __init__(self, root: str | Path | None = None, max_bytes: int | None = None):
        self.root = Path(root or os.environ.get("UNI_AGENT_IMAGE_CACHE") or DEFAULT_CACHE)
        gigabytes = float(os.environ.get("UNI_AGENT_IMAGE_CACHE_GB") or DEFAULT_CACHE_GB)
        self.max_bytes = max_bytes if max_bytes is not None else int(gigabytes * 2**30)
        (self.root / "locks").mkdir(parents=True, exist_ok=True)

    # -- the one entry point a sandbox uses ------------------------------------------------------------------------
    def open(self, reference: str) -> ImageLease:
        """The image, unpacked (once per node), with a shared lock held until the lease is released."""
        source = parse_reference(reference)
        for _ in range(3):  # another process may evict it between our unpack and our lock: then fetch it again
            digest = self._known_digest(reference, source)
            unpacked = False
            if digest is None or not (self._dir(digest) / META).exists():
                with self._staged(reference, source) as (layout, tag):
                    digest = _manifest_digest(layout, tag, reference)
                    unpacked = self._unpack_once(reference, layout, tag, digest)
                self._remember(reference, source, digest)
            meta = self._dir(digest) / META
            try:
                fd = os.open(meta, os.O_RDONLY)
            except FileNotFoundError:
                self._forget(reference, source)
                continue
            fcntl.flock(fd, fcntl.LOCK_SH)  # eviction takes LOCK_EX without waiting, so a leased image stays
            if not meta.exists():  # evicted between the open and the lock
                os.close(fd)
                self._forget(reference, source)
                continue
            os.utime(meta)  # least recently used = oldest mtime
            return ImageLease(self._read_meta(reference, digest), fd, unpacked)
        raise ImageError(f"image {reference!r} was evicted from {self.root} three times while starting: the cache "
                         f"limit (UNI_AGENT_IMAGE_CACHE_GB) is too small for the images in use")

    # -- where things are -----------------------------------------------------------------------------------------
    def _dir(self, digest: str) -> Path:
        return self.root / (digest.replace(":", "-") + _unpack_mode()[0])

    def _ref_file(self, reference: str, source: Source) -> Path:
        key = reference
        if source.kind != "registry":  # a file that changes (re-saved) is another image
            stat = os.stat(source.location)
            key = f"{reference}|{stat.st_mtime_ns}|{stat.st_size}"
        return self.root / "refs" / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".json")

    def _known_digest(self, reference: str, source: Source) -> str | None:
        try:
            return json.loads(self._ref_file(reference, source).read_text())["digest"]
        except (OSError, ValueError, KeyError):
            return None

    def _remember(self, reference: str, source: Source, digest: str) -> None:
        path = self._ref_file(reference, source)
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"reference": reference, "digest": digest}))
        tmp.replace(path)

    def _forget(self, reference: str, source: Source) -> None:
        self._ref_file(reference, source).unlink(missing_ok=True)

    # -- getting an OCI layout to unpack from ---------------------------------------------------------------------
    def _staged(self, reference: str, source: Source) -> StagedLayout:
        return StagedLayout(self.root, reference, source)

    # -- unpacking, once ------------------------------------------------------------------------------------------
    def _unpack_once(self, reference: str, layout: Path, tag: str, digest: str) -> bool:
        target = self._dir(digest)
        with _locked(self.root / "locks" / f"{target.name}.lock"):
            if (target / META).exists():
                return False  # another worker unpacked it while we waited
            remove_tree(target)  # a half-done unpack of a worker that died
            bundle = Path(tempfile.mkdtemp(prefix=f"{target.name}.", suffix=".unpacking", dir=self.root))
            try:
                shutil.rmtree(bundle)  # umoci wants to create it
                run_tool(_unpack_mode()[1] + ["--image", f"{layout}:{tag}", str(bundle)], reference, "unpack",
                         "umoci")
                meta = _meta_from_bundle(bundle, layout, tag, digest, reference)
                bundle.rename(target)
                (target / META).write_text(json.dumps(meta))
            finally:
                remove_tree(bundle)
        self.evict(keep=digest)
        return True

    def _read_meta(self, reference: str, digest: str) -> ImageRootfs:
        meta = json.loads((self._dir(digest) / META).read_text())
        return ImageRootfs(reference=reference, digest=digest, rootfs=self._dir(digest) / "rootfs",
                           env=tuple(meta["env"]), workdir=meta["workdir"], uid=meta["uid"], gid=meta["gid"],
                           home=meta["home"], size_bytes=meta["size_bytes"])

    # -- the size limit -------------------------------------------------------------------------------------------
    def images(self) -> list[tuple[float, int, Path]]:
        """(last used, size, dir) of every unpacked image."""
        found = []
        for meta in self.root.glob(f"*/{META}"):
            with _suppress_missing():
                found.append((meta.stat().st_mtime, json.loads(meta.read_text())["size_bytes"], meta.parent))
        return sorted(found)

    def evict(self, keep: str | None = None) -> list[Path]:
        """Remove the least recently used images until the cache fits its limit; images in use are skipped."""
        removed = []
        with _locked(self.root / "locks" / "evict"):
            images = self.images()
            total = sum(size for _, size, _ in images)
            for _, size, image_dir in images:
                if total <= self.max_bytes:
                    break
                if keep is not None and image_dir == self._dir(keep):
                    continue
                if self._remove_unless_leased(image_dir):
                    total -= size
                    removed.append(image_dir)
        return removed

    def _remove_unless_leased(self, image_dir: Path) -> bool:
        try:
            fd = os.open(image_dir / META, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False  # a sandbox is running on it
        try:
            (image_dir / META).unlink()  # first: from here on it is "not unpacked" to everyone
            remove_tree(image_dir)
        finally:
            os.close(fd)
        return True


def _unpack_mode() -> tuple[str, list[str]]:
    """(suffix of the image dirs, umoci's argv) for who we are: root; a namespace with subordinate ids; neither."""
    if os.geteuid() == 0:
        return "", ["umoci", "unpack"]
    namespace = user_namespace()
    if namespace is not None and namespace.subordinate:
        # As root of the namespace umoci sets the image's owners (mapped to our subordinate ids); it writes device
        # nodes, which it cannot make there, as empty files (bubblewrap mounts its own /dev over them).
        return "-subids", [*namespace.argv(mount=False), "umoci", "unpack"]
    return "-rootless", ["umoci", "unpack", "--rootless"]


def _manifest_digest(layout: Path, tag: str, reference: str) -> str:
    for entry in read_json(layout / "index.json", reference).get("manifests", []):
        if entry.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
            return entry["digest"]
    raise ImageError(f"image {reference!r}: no manifest tagged {tag!r} in {layout}")


def _meta_from_bundle(bundle: Path, layout: Path, tag: str, digest: str, reference: str) -> dict[str, Any]:
    """Env and WorkingDir as the image config states them; uid/gid as umoci resolved its User in the rootfs."""
    manifest = read_json(blob_path(layout, digest), reference)
    config = read_json(blob_path(layout, manifest["config"]["digest"]), reference).get("config") or {}
    process = read_json(bundle / "config.json", reference)["process"]
    user = process["user"]
    home = next((item[5:] for item in process.get("env", []) if item.startswith("HOME=")), "/root")
    size = sum(entry.stat(follow_symlinks=False).st_size for entry in (bundle / "rootfs").rglob("*"))
    return {"reference": reference, "tag": tag, "env": config.get("Env") or [], "workdir": config.get("WorkingDir") or "",
            "uid": int(user.get("uid", 0)), "gid": int(user.get("gid", 0)), "home": home, "size_bytes": size, "unpacked_at": time.time()}


class _locked:
    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: Any) -> None:
        os.close(self.fd)


class _suppress_missing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, *exc: Any) -> bool:
        return kind is not None and issubclass(kind, (FileNotFoundError, KeyError, ValueError))


def images_in_dataset(path: str) -> list[str]:
    """Every distinct `image` of a local deployment that the rows of a dataset (Parquet) name."""
    import pyarrow.parquet as pq

    found: dict[str, None] = {}
    for row in pq.read_table(path, columns=["extra_info"]).column("extra_info").to_pylist():
        deployment = (((row or {}).get("tools_kwargs") or {}).get("env") or {}).get("deployment") or {}
        if deployment.get("type") == "local" and deployment.get("image"):
            found[deployment["image"]] = None
    return list(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m uni_agent.sandbox.image_store",
                                     description="Fetch and unpack images into this node's cache (a pre-pull).")
    sub = parser.add_subparsers(dest="command", required=True)
    pull = sub.add_parser("pull", help="unpack these images (or every image a dataset's local rows name)")
    pull.add_argument("references", nargs="*")
    pull.add_argument("--dataset", action="append", default=[], help="a Parquet dataset; may repeat")
    sub.add_parser("list", help="the unpacked images, least recently used first")
    args = parser.parse_args(argv)
    store = ImageStore()
    if args.command == "list":
        for used, size, image_dir in store.images():
            meta = json.loads((image_dir / META).read_text())
            print(f"{image_dir.name}  {size / 2**20:9.1f} MiB  used {time.ctime(used)}  {meta['reference']}")
        return 0
    references = list(args.references) + [ref for path in args.dataset for ref in images_in_dataset(path)]
    failed = 0
    for reference in dict.fromkeys(references):
        started = time.monotonic()
        try:
            lease = store.open(reference)
        except ImageError as exc:
            print(f"FAILED {exc}", file=sys.stderr)
            failed += 1
            continue
        lease.release()
        what = "unpacked" if lease.unpacked else "cached"
        print(f"{what:8} {lease.image.digest[:19]}  {time.monotonic() - started:6.1f} s  {reference}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
