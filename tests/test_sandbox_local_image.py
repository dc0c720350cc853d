"""The local sandbox over container images, for real: images built here by podman (tests/container_image.py), saved
as OCI layouts and archives, unpacked by umoci into a cache, run by bubblewrap with no container runtime involved.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from container_image import image_for_tests
from test_sandbox_local import processes_with, wait_until_gone

from uni_agent.config import AgentConfigs
from uni_agent.grading import verify_patch
from uni_agent.sandbox import SandboxError
from uni_agent.sandbox import image_sources
from uni_agent.sandbox.image_sources import ImageError
from uni_agent.sandbox.image_store import META, ImageStore
from uni_agent.sandbox.local import LocalDeploymentConfig, LocalSandbox
from uni_agent.tasks.swe_form import BUNDLED_DIR, load_instance

REPO_ROOT = Path(__file__).resolve().parent.parent
LOCAL_CONFIG = REPO_ROOT / "examples" / "agent_interaction" / "agent_config_local.yaml"

# A second image on the test image, with what an unpacker can get wrong: a deleted file (whiteout), a directory
# replaced wholesale (opaque whiteout), a hard link, and the config's Env, WorkingDir and User.
DERIVED = """\
FROM {base}
RUN mkdir -p /opt/keep && echo old > /opt/keep/old.txt && echo doomed > /etc/doomed.txt && echo data > /srv/original
RUN rm /etc/doomed.txt && rm -rf /opt/keep && mkdir /opt/keep && echo new > /opt/keep/new.txt \\
    && ln /srv/original /srv/hardlink && useradd -u 1234 -m agent && mkdir /work && chown agent /work
ENV GREETING="hello world"
WORKDIR /work
USER agent
"""


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def base_image() -> str:
    return image_for_tests()[0]  # a failure where it could be built; a skip where only root could


@pytest.fixture(scope="module")
def saved(base_image: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The base image as an OCI layout; the derived one as an OCI archive and as a docker archive."""
    out = tmp_path_factory.mktemp("images")
    (out / "Containerfile").write_text(DERIVED.format(base=base_image))
    derived = "localhost/uni-agent-test-derived:v1"
    subprocess.run(["podman", "--runtime", "runc", "build", "--network", "none", "-t", derived, "-f",
                    str(out / "Containerfile"), str(out)], check=True, capture_output=True, timeout=600)
    refs = {"layout": f"oci:{out / 'layout'}", "archive": f"oci-archive:{out / 'derived.tar'}",
            "docker": f"docker-archive:{out / 'derived-docker.tar'}"}
    subprocess.run(["podman", "save", "--format", "oci-dir", "-o", str(out / "layout"), base_image], check=True,
                   capture_output=True, timeout=600)
    subprocess.run(["podman", "save", "--format", "oci-archive", "-o", str(out / "derived.tar"), derived],
                   check=True, capture_output=True, timeout=600)
    subprocess.run(["podman", "save", "--format", "docker-archive", "-o", str(out / "derived-docker.tar"), derived],
                   check=True, capture_output=True, timeout=600)
    return refs


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("image-cache")


@pytest.fixture(autouse=True)
def isolated(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("UNI_AGENT_IMAGE_CACHE", str(cache))
    monkeypatch.setenv("UNI_AGENT_SANDBOX_ROOT", str(tmp_path / "sandboxes"))
    yield
    left = list((tmp_path / "sandboxes").iterdir()) if (tmp_path / "sandboxes").exists() else []
    assert left == [], f"sandbox dirs left behind: {left}"
    assert [p.name for p in cache.iterdir() if p.name.startswith("staging.") or "unpacking" in p.name] == []


def sandbox(image: str, **fields: Any) -> LocalSandbox:
    box = LocalDeploymentConfig(image=image, **fields).build({"FROM_ROW": "row value"}, "img")
    assert isinstance(box, LocalSandbox)
    return box


def test_derived_image_runs_as_its_config_says_with_its_layers_applied(saved: dict[str, str]) -> None:
    async def main() -> dict[str, str]:
        box = sandbox(saved["archive"])
        async with box:
            marker = str(box.dir).encode()  # on the command line of the sandbox's process chain
            outputs = {}
            for key, command in {
                "user": "id -u; id -g",
                "pwd": "pwd",
                "env": 'echo "$GREETING|$FROM_ROW|$HOME"',
                "whiteout": "test -e /etc/doomed.txt && echo present || echo absent",
                "opaque": "ls /opt/keep",
                "hardlink": "stat -c %i /srv/original /srv/hardlink | uniq | wc -l",
                "caps": "grep CapEff /proc/self/status",
                "host": f"test -e {REPO_ROOT} && echo visible || echo invisible",
                "readonly_for_user": "touch /usr/probe 2>&1 || echo denied",
                "network": "cat /proc/net/dev | grep -c ':' ",
            }.items():
                result = await box.exec(command, 20)
                outputs[key] = result.output.strip()
            inside = processes_with(marker)
        assert box.dir is None  # closed: its dir is gone
        assert inside and wait_until_gone(inside, 10) == []  # and every process of it
        return outputs

    out = run(main())
    assert out["user"].split() == ["1234", "1234"]
    assert out["pwd"] == "/work"
    assert out["env"] == "hello world|row value|/home/agent"
    assert out["whiteout"] == "absent"
    assert out["opaque"] == "new.txt"
    assert out["hardlink"] == "1"
    assert out["caps"].split()[-1] == "0000000000000000"
    assert out["host"] == "invisible"
    assert "denied" in out["readonly_for_user"] or "Permission denied" in out["readonly_for_user"]
    assert out["network"] == "1"  # only lo: no network unless asked


def test_a_docker_save_archive_gives_the_same_root(saved: dict[str, str]) -> None:
    async def main() -> str:
        async with sandbox(saved["docker"]) as box:
            return (await box.exec("cat /opt/keep/new.txt; test -e /etc/doomed.txt || echo gone; id -un", 20)).output

    assert run(main()).split() == ["new", "gone", "agent"]


def test_writes_are_per_sandbox_and_nothing_is_left(saved: dict[str, str], cache: Path) -> None:
    async def main() -> tuple[str, str, list[int]]:
        first, second = sandbox(saved["layout"]), sandbox(saved["layout"])
        async with first, second:
            await first.exec("echo mine > /etc/motd && rm /etc/issue", 20)
            seen = (await second.exec("cat /etc/motd; test -e /etc/issue && echo issue-here", 20)).output
            mine = (await first.exec("cat /etc/motd; test -e /etc/issue || echo issue-gone", 20)).output
            sandbox_processes = processes_with(first.name.encode()) + processes_with(second.name.encode())
        return seen, mine, sandbox_processes

    seen, mine, sandbox_processes = run(main())
    assert "mine" not in seen and "issue-here" in seen
    assert mine.split() == ["mine", "issue-gone"]
    assert wait_until_gone(sandbox_processes, 10) == []
    digest_dirs = [p for p in cache.iterdir() if p.name.startswith("sha256-")]
    rootfs = next(p / "rootfs" for p in digest_dirs if (p / "rootfs" / "etc" / "issue").exists())
    assert "mine" not in (rootfs / "etc" / "motd").read_text()  # the shared root never changes
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(rootfs) not in mounts and os.environ["UNI_AGENT_SANDBOX_ROOT"] not in mounts


def test_bundled_tasks_verify_gold_and_empty_patches_inside_the_image(saved: dict[str, str]) -> None:
    tasks = sorted(p.name for p in BUNDLED_DIR.iterdir() if (p / "instance.json").exists())[:2]
    agents = AgentConfigs.load(LOCAL_CONFIG)

    async def main() -> list[tuple[str, str, Any]]:
        jobs = []
        for task in tasks:
            instance = load_instance(BUNDLED_DIR / task)
            agent = agents.for_row("swe_agent", {
                "env": {"deployment": {"type": "local", "image": saved["layout"], "repo": f"bundled:{task}"}},
                "reward": {"name": "swe_local", "metadata": {
                    "test_patch": instance["test_patch"], "FAIL_TO_PASS": instance["FAIL_TO_PASS"],
                    "PASS_TO_PASS": instance["PASS_TO_PASS"]}}}, f"task {task}")
            jobs += [(task, "gold", verify_patch(agent, instance["patch"], f"{task}-gold")),
                     (task, "empty", verify_patch(agent, "", f"{task}-empty"))]
        outcomes = await asyncio.gather(*(job for _, _, job in jobs))
        return [(task, kind, outcome) for (task, kind, _), outcome in zip(jobs, outcomes, strict=True)]

    for task, kind, outcome in run(main()):
        expected = (1.0, "resolved") if kind == "gold" else (0.0, "unresolved")
        assert (outcome.reward, outcome.status) == expected, (task, kind, outcome.error, outcome.log_tail)


def test_two_processes_starting_one_image_unpack_it_once(saved: dict[str, str], tmp_path: Path) -> None:
    fresh = tmp_path / "fresh-cache"
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO_ROOT)!r})
        from uni_agent.sandbox.image_store import ImageStore
        lease = ImageStore({str(fresh)!r}).open({saved["layout"]!r})
        print(lease.unpacked, lease.image.digest)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [proc.communicate(timeout=300) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), [err for _, err in results]
    unpacked = sorted(out.split()[0] for out, _ in results)
    assert unpacked == ["False", "True"]
    assert len({out.split()[1] for out, _ in results}) == 1
    assert len([p for p in fresh.iterdir() if p.name.startswith("sha256-")]) == 1


def test_least_recently_used_images_are_evicted_unless_in_use(saved: dict[str, str], tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "small-cache", max_bytes=1)  # any two images are over the limit
    base = store.open(saved["layout"])
    derived = store.open(saved["archive"])  # its unpack evicts what it can: the base is leased, so it stays
    assert (base.image.rootfs.parent / META).exists() and (derived.image.rootfs.parent / META).exists()
    base.release()
    removed = store.evict()
    assert removed == [base.image.rootfs.parent]  # least recently used and not in use
    assert (derived.image.rootfs.parent / META).exists()  # still leased
    derived.release()
    again = store.open(saved["layout"])  # gone from the cache: unpacked again
    assert again.unpacked
    again.release()


def test_bad_images_are_clear_errors_and_leave_nothing(saved: dict[str, str], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    store = ImageStore(tmp_path / "errors-cache")
    with pytest.raises(ImageError, match="no-such-layout"):
        store.open(f"oci:{tmp_path / 'no-such-layout'}")

    corrupt = tmp_path / "corrupt"
    shutil.copytree(saved["layout"].removeprefix("oci:"), corrupt)
    layer = max((corrupt / "blobs" / "sha256").iterdir(), key=lambda p: p.stat().st_size)
    data = bytearray(layer.read_bytes())
    data[len(data) // 2] ^= 0xFF
    layer.write_bytes(bytes(data))
    with pytest.raises(ImageError, match=r"umoci unpack failed"):
        store.open(f"oci:{corrupt}")
    assert [p.name for p in store.root.iterdir() if p.name.startswith(("sha256-", "staging."))
            or "unpacking" in p.name] == []

    real_which = shutil.which
    monkeypatch.setattr(image_sources.shutil, "which", lambda cmd, *a, **k: None if cmd == "skopeo"
                        else real_which(cmd, *a, **k))
    with pytest.raises(ImageError, match=r"skopeo is not installed.*apt-get install skopeo"):
        store.open("docker.io/library/uni-agent-no-such-image:1")

    async def start_missing() -> None:
        async with sandbox(f"oci-archive:{tmp_path / 'missing.tar'}"):
            pass

    with pytest.raises(SandboxError, match="missing.tar"):  # not a start error: retrying cannot help
        run(start_missing())


def test_terminal_bench_oracle_in_its_image_on_the_local_backend(base_image: str, tmp_path: Path,
                                                                  dask_client: Any) -> None:
    """use-installed-tool's tool exists only in its image (a RUN put it in /opt): with --local-images the row
    names the image podman built, and bubblewrap runs it. The workers use the default image cache."""
    from test_terminal_bench import preprocess

    from uni_agent.driver.dataset import read_rows
    from uni_agent.terminal_bench.preprocess import BUNDLED_TASKS_DIR
    from uni_agent.driver.verify import verify_all

    tasks = tmp_path / "tasks"
    shutil.copytree(BUNDLED_TASKS_DIR / "use-installed-tool", tasks / "use-installed-tool")
    preprocess(tmp_path, "--tasks-dir", str(tasks), "--deployment", "local", "--local-images", "--build-images",
               "--build-arg", f"BASE_IMAGE={base_image}", "--build-network", "none")
    rows = read_rows(tmp_path / "terminal_bench_v2_local.parquet")
    deployment = rows[0]["extra_info"]["tools_kwargs"]["env"]["deployment"]
    assert deployment["type"] == "local" and deployment["image"].startswith("localhost/uni-agent-tb-")
    address = dask_client.scheduler.address
    oracle = verify_all(rows, LOCAL_CONFIG, patch="oracle", output_dir=str(tmp_path / "oracle"),
                        scheduler_address=address, progress=False)
    assert oracle.summary["avg_at_n"] == 1.0, oracle.summary
    import pandas as pd

    graded = pd.read_parquet(tmp_path / "oracle" / "verify_oracle.parquet").set_index("instance_id")
    assert "grezvany orapu" in json.loads(graded.loc["use-installed-tool", "verification"])["log_tail"]
    empty = verify_all(rows, LOCAL_CONFIG, patch="empty", output_dir=str(tmp_path / "empty"),
                       scheduler_address=address, progress=False)
    assert empty.summary["resolved"] == 0


def test_pre_pull_unpacks_every_image_a_dataset_names_once(saved: dict[str, str], tmp_path: Path) -> None:
    """The SLURM pre-pull step (cluster/sandbox-workers.sbatch): `python -m uni_agent.sandbox.image_store pull`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def row(deployment: dict[str, Any]) -> dict[str, Any]:
        return {"instance_id": "x", "extra_info": {"tools_kwargs": {"env": {"deployment": deployment}}}}

    dataset = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([row({"type": "local", "image": saved["layout"]}),
                                         row({"type": "local", "image": saved["layout"]}),
                                         row({"type": "podman", "image": "not-ours"}),
                                         row({"type": "local", "image": f"oci:{tmp_path / 'absent'}"})]), dataset)
    env = {**os.environ, "UNI_AGENT_IMAGE_CACHE": str(tmp_path / "node-cache")}
    command = [sys.executable, "-m", "uni_agent.sandbox.image_store"]
    first = subprocess.run([*command, "pull", "--dataset", str(dataset)], capture_output=True, text=True, env=env,
                           cwd=REPO_ROOT, timeout=300)
    assert first.returncode == 1  # the absent image failed, and says which
    assert first.stdout.count("unpacked") == 1 and "not-ours" not in first.stdout + first.stderr
    assert "absent" in first.stderr
    second = subprocess.run([*command, "pull", saved["layout"]], capture_output=True, text=True, env=env,
                            cwd=REPO_ROOT, timeout=300)
    assert second.returncode == 0 and second.stdout.startswith("cached"), second.stdout + second.stderr
    listed = subprocess.run([*command, "list"], capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=60)
    assert saved["layout"] in listed.stdout and "MiB" in listed.stdout
