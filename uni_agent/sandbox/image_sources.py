"""Where an image comes from, as an OCI image layout on this machine that umoci can unpack (image_store.py).

A layout directory is used as it is; an OCI archive is extracted; a `docker save` archive is rewritten as a layout
(the same layer tars and config, new descriptors); a registry reference is copied with skopeo, or saved from the
local podman store where podman has the image. Every failure is an ImageError naming the image and what to do.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from .base import SandboxError

TOOL_TIMEOUT_S = 3600  # a multi-GB pull or unpack on a slow disk


class ImageError(SandboxError):
    """The image cannot be had: missing, corrupt, or a tool it needs is not installed. Not retried: it will not
    change by itself. The message names the image and what to do."""


@dataclass(frozen=True)
class Source:
    kind: str  # "oci" (a layout dir), "oci-archive", "docker-archive" or "registry"
    location: str  # the path, or the registry reference
    tag: str | None = None


def parse_reference(reference: str) -> Source:
    for kind in ("oci-archive", "docker-archive", "oci"):
        if reference.startswith(kind + ":"):
            path, _, tag = reference[len(kind) + 1:].partition(":")
            if kind == "docker-archive" and tag:
                path, tag = f"{path}:{tag}", ""  # docker archives have no tag in the reference
            return Source(kind, os.path.abspath(path), tag or None)
    if reference.startswith(("/", "./", "../")) or os.path.exists(reference):
        path = os.path.abspath(reference)
        if os.path.isdir(path):
            return Source("oci", path)
        if os.path.isfile(path):
            return Source(_archive_kind(path, reference), path)
        raise ImageError(f"image {reference!r}: no such file or directory")
    return Source("registry", reference.removeprefix("docker://"))


def _archive_kind(path: str, reference: str) -> str:
    try:
        with tarfile.open(path) as tar:
            names = set(tar.getnames())
    except (OSError, tarfile.TarError) as exc:
        raise ImageError(f"image {reference!r}: {path} is not a readable tar archive ({exc})") from None
    if "index.json" in names or "./index.json" in names:
        return "oci-archive"
    if "manifest.json" in names or "./manifest.json" in names:
        return "docker-archive"
    raise ImageError(f"image {reference!r}: {path} is neither an OCI archive (index.json) nor a docker/podman save "
                     f"archive (manifest.json)")


class StagedLayout:
    """An OCI layout of the image to unpack from: the source itself when it is one, else a temporary copy."""

    def __init__(self, root: Path, reference: str, source: Source):
        self.root, self.reference, self.source = root, reference, source
        self.tmp: Path | None = None

    def __enter__(self) -> tuple[Path, str]:
        try:
            return self._stage()
        except BaseException:
            self.__exit__()
            raise

    def _stage(self) -> tuple[Path, str]:
        source, reference = self.source, self.reference
        if source.kind == "oci":
            if not (Path(source.location) / "index.json").exists():
                raise ImageError(f"image {reference!r}: {source.location} is not an OCI image layout (no index.json)")
            return Path(source.location), _pick_tag(Path(source.location), source.tag, reference)
        self.tmp = Path(tempfile.mkdtemp(prefix="staging.", dir=self.root))
        layout = self.tmp / "layout"
        if source.kind == "oci-archive":
            _extract_layout(source.location, layout, reference)
            return layout, _pick_tag(layout, source.tag, reference)
        if source.kind == "docker-archive":
            _docker_archive_to_layout(source.location, layout, reference)
            return layout, "image"
        _fetch_registry_image(source.location, layout, self.tmp, reference)
        return layout, "image"

    def __exit__(self, *exc: Any) -> None:
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)


def _pick_tag(layout: Path, tag: str | None, reference: str) -> str:
    """The tag to unpack: the one asked for, else the layout's only one (umoci unpacks by tag)."""
    index = read_json(layout / "index.json", reference)
    names = [m.get("annotations", {}).get("org.opencontainers.image.ref.name") for m in index.get("manifests", [])]
    names = [n for n in names if n]
    if tag is not None:
        if tag not in names:
            raise ImageError(f"image {reference!r}: tag {tag!r} is not in {layout} (it has: {', '.join(names) or 'none'})")
        return tag
    if len(names) != 1:
        raise ImageError(f"image {reference!r}: {layout} holds {len(names)} tagged images "
                         f"({', '.join(names) or 'none'}); name one as oci:PATH:TAG")
    return names[0]


def blob_path(layout: Path, digest: str) -> Path:
    algorithm, _, hexdigest = digest.partition(":")
    return layout / "blobs" / algorithm / hexdigest


def read_json(path: Path, reference: str) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ImageError(f"image {reference!r}: {path.name} is missing from the image ({path})") from None
    except (OSError, ValueError) as exc:
        raise ImageError(f"image {reference!r}: {path} cannot be read as JSON ({exc})") from None


def _safe_members(tar: tarfile.TarFile, reference: str) -> Iterator[tarfile.TarInfo]:
    for member in tar:
        name = os.path.normpath(member.name)
        inside = not name.startswith(("..", "/"))
        if member.issym():  # docker archives link layers they share; the target must stay in the archive
            inside = inside and not os.path.normpath(os.path.join(os.path.dirname(name), member.linkname)).startswith(
                ("..", "/"))
        elif not (member.isfile() or member.isdir()):
            inside = False
        if not inside:
            raise ImageError(f"image {reference!r}: the archive holds {member.name!r}, which is not part of an image")
        yield member


def _extract_layout(archive: str, layout: Path, reference: str) -> None:
    try:
        with tarfile.open(archive) as tar:
            # _safe_members already admits only plain files and dirs inside the layout; the filter where it exists
            extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(layout, members=_safe_members(tar, reference), **extra)
    except (OSError, tarfile.TarError) as exc:
        raise ImageError(f"image {reference!r}: cannot read the archive {archive} ({exc})") from None


def _docker_archive_to_layout(archive: str, layout: Path, reference: str) -> None:
    """A `docker save` tarball as an OCI layout tagged `image`: the same layer tars and config, new descriptors."""
    extracted = layout.parent / "archive"
    _extract_layout(archive, extracted, reference)
    manifests = read_json(extracted / "manifest.json", reference)
    if not isinstance(manifests, list) or len(manifests) != 1:
        raise ImageError(f"image {reference!r}: {archive} holds {len(manifests)} images; save one image per archive")
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def add(path: Path, media_type: str) -> dict[str, Any]:
        real = path.resolve()  # a layer may be a link to another entry's
        data_digest = _sha256_file(real)
        if not (blobs / data_digest).exists():
            os.link(real, blobs / data_digest)
        return {"mediaType": media_type, "digest": f"sha256:{data_digest}", "size": real.stat().st_size}

    config = add(extracted / manifests[0]["Config"], "application/vnd.oci.image.config.v1+json")
    layers = [add(extracted / layer, "application/vnd.oci.image.layer.v1.tar") for layer in manifests[0]["Layers"]]
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": config, "layers": layers}).encode()
    manifest_digest = hashlib.sha256(manifest).hexdigest()
    (blobs / manifest_digest).write_bytes(manifest)
    index = {"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": f"sha256:{manifest_digest}",
        "size": len(manifest), "annotations": {"org.opencontainers.image.ref.name": "image"}}]}
    (layout / "index.json").write_text(json.dumps(index))
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')


def _fetch_registry_image(name: str, layout: Path, tmp: Path, reference: str) -> None:
    """skopeo where installed (any registry); else podman's own store, for an image podman has (`podman save`)."""
    if shutil.which("skopeo"):
        run_tool(["skopeo", "copy", "--quiet", f"docker://{name}", f"oci:{layout}:image"], reference, "pull")
        return
    if shutil.which("podman") and subprocess.run(["podman", "image", "exists", name], capture_output=True).returncode == 0:
        archive = tmp / "podman.tar"
        run_tool(["podman", "save", "--quiet", "--format", "oci-archive", "-o", str(archive), name], reference, "save")
        _extract_layout(str(archive), layout, reference)
        index = read_json(layout / "index.json", reference)
        for entry in index.get("manifests", []):  # podman tags it with its own name; unpack it as `image`
            entry.setdefault("annotations", {})["org.opencontainers.image.ref.name"] = "image"
        (layout / "index.json").write_text(json.dumps(index))
        return
    raise ImageError(f"image {reference!r} is a registry reference, and skopeo is not installed to fetch it "
                     f"(apt-get install skopeo), nor does a local podman have it; or give an OCI layout or archive "
                     f"(oci:PATH, oci-archive:PATH, docker-archive:PATH)")


def run_tool(argv: list[str], reference: str, step: str, tool: str = "") -> None:
    """Run `tool` (argv[0] unless named: argv may start with a namespace's prefix); failures are ImageErrors."""
    tool = tool or argv[0]
    if shutil.which(tool) is None:
        raise ImageError(f"image {reference!r}: {tool} is not installed (apt-get install {tool}); it is needed "
                         f"to {step} images for local sandboxes")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ImageError(f"image {reference!r}: {tool} {step} took over {TOOL_TIMEOUT_S} s") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-1500:]
        raise ImageError(f"image {reference!r}: {tool} {step} failed (exit {done.returncode}): {tail}")


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
