"""SWE-bench Verified, SWE-Gym, SWE-rebench and SWE-smith → dataset rows in the seed schema, one Parquet file per
source and deployment (`--source`).

    python examples/data_preprocess/swe_bench_verified.py --local-save-dir data/ --input swe_bench_verified.parquet
    python examples/data_preprocess/swe_gym.py --input swe_gym.parquet --specs swe_gym_specs.json --deployment podman
    python examples/data_preprocess/swe_rebench.py --input swe_rebench.parquet --deployment modal
    python examples/data_preprocess/swe_smith.py --input swe_smith.parquet --deployment docker

Sources: `swe_bench_verified` (the default), `swe_gym` (the SWE-bench schema on other repositories, images
`xingyaoww/sweb.eval.x86_64.<id with __ as _s_>`; their test specs are not in swebench 4.1.0's table, so a spec
file (`--specs`) gives them, and each row carries its own), `swe_rebench` (per-instance `install_config` with the
test command and log parser, and `docker_image`), `swe_smith` (see smith_rows.py: graded by `swe_smith`). Every row
names its source in `data_source`, and its grader and spec travel in the row, so rows of several sources mix in
one run.

The input (read and checked in instances.py) is the official dataset: by its hub name (needs the network and the
`datasets` package, which the `swebench` extra installs) or a local Parquet / JSONL / JSON file with the official
fields. Each row becomes:

- `prompt`: our system and user messages (the repository at /testbed, the issue, finish with `submit`);
- `agent_name`: `swe_agent` (must match a `name` in the agent config YAML);
- `extra_info.tools_kwargs.env.deployment`: `type` and the instance image for the deployment (see
  `spec.image_name`). `local` rows name the same image as docker/podman rows: a bubblewrap sandbox runs over the
  image's root filesystem, no container runtime needed (sandbox/image_store.py: skopeo or a local podman fetches it,
  or pre-pull it into the node's cache). With `--local-repos DIR` a local row runs on this machine's own filesystem
  instead, with the repository from `DIR/<instance_id>` and its test environment already here (for debugging;
  official grading needs the official images).
- `extra_info.tools_kwargs.reward`: `{name: swe_bench, metadata: <the official fields>}`;
- `data_source`, `instance_id`.

A malformed input row is reported with its index and instance_id and left out; the other rows are written.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ..config import ConfigError
from ..tasks.rows import seed_row
from .instances import DATA_SOURCE, HUB_NAME, METADATA_FIELDS, load_specs, normalize_instance, read_instances
from .spec import DEPLOYMENTS, ENV_PREBUILT, WORKDIR, image_name

# source → (hub name, split): where the rows come from when --input is not given.
SOURCES = {
    "swe_bench_verified": (HUB_NAME, "test"),
    "swe_gym": ("SWE-Gym/SWE-Gym", "train"),
    "swe_rebench": ("nebius/SWE-rebench", "test"),
    "swe_smith": ("SWE-bench/SWE-smith", "train"),
}
SWE_GYM_IMAGE_NAMESPACE = "xingyaoww"  # SWE-Gym's published instance images
SWE_REBENCH_IMAGE_NAMESPACE = "swerebench"  # SWE-rebench's, when a row has no docker_image

SYSTEM_PROMPT = (
    "You are an expert software engineer. You work in a Linux sandbox through the tools you are given, "
    "one step at a time, and you check the effect of each change you make."
)

USER_PROMPT = """The Python repository {repo} is checked out at {workdir}, with its dependencies installed.
A user reported this issue:

<issue>
{problem_statement}
</issue>

Fix the issue by changing the non-test source files under {workdir}. Tests for the issue already exist and are
hidden from you; do not modify existing tests. A good way to work:
1. Find the code involved (`execute_bash` with grep, find, ls; `str_replace_editor` with `view`).
2. Reproduce the problem with a short script in /tmp (outside the repository) run with `execute_bash`.
3. Make the smallest correct change with `str_replace_editor`.
4. Run your script again, and the existing tests closest to your change, to confirm the fix and that nothing broke.
5. Think about edge cases the fix must also handle.
When you are done, call `submit`. Your changes to {workdir} are your answer."""


@dataclass
class RowProblem:
    index: int
    instance_id: str
    error: str

    def __str__(self) -> str:
        return f"row {self.index} (instance_id={self.instance_id}): {self.error}"


def source_image(instance: dict[str, str], source: str, deployment: str, registry: str | None = None) -> str | None:
    """The instance image of a row of `source` for `deployment` (None for local); ConfigError when the source
    publishes no image that the deployment can use (vefaas mirrors SWE-bench Verified only)."""
    if source == DATA_SOURCE:
        return image_name(instance["instance_id"], deployment, registry)
    if deployment not in DEPLOYMENTS:
        raise ConfigError(f"unknown deployment {deployment!r}; choose one of {', '.join(DEPLOYMENTS)}")
    if deployment == "local":
        return None
    key = instance["instance_id"].lower()
    if source == "swe_gym":
        name, field = f"{SWE_GYM_IMAGE_NAMESPACE}/sweb.eval.x86_64.{key.replace('__', '_s_')}", "instance_id"
    else:
        name = instance.get("docker_image") or \
            f"{SWE_REBENCH_IMAGE_NAMESPACE}/sweb.eval.x86_64.{key.replace('__', '_1776_')}"
        field = "docker_image" if instance.get("docker_image") else "instance_id"
    if deployment == "vefaas":
        raise ConfigError(f"{field}: the image {name!r} cannot be used for deployment vefaas: there is no known "
                          f"vefaas mirror of {source}'s images (use modal, docker or podman)")
    return f"{registry.rstrip('/')}/{name}" if registry else name


def instance_to_row(instance: dict[str, str], deployment: str, agent_name: str = "swe_agent",
                    local_repos: str | Path | None = None, image_registry: str | None = None,
                    source: str = DATA_SOURCE) -> dict[str, Any]:
    # local without --local-repos runs the instance image itself (bubblewrap over its root filesystem, no container
    # runtime): the same image the docker/podman rows name, so one dataset runs on a laptop and on a bare node.
    image_from = "docker" if deployment == "local" and local_repos is None else deployment
    image = source_image(instance, source, image_from, image_registry)
    target: dict[str, Any] = {"type": deployment}
    if image is not None:
        target["image"] = image
        if deployment == "local":
            target["workdir"] = WORKDIR
    else:  # local with --local-repos: the host's filesystem, the repository from this machine (module docstring)
        target["workdir"] = WORKDIR
        if local_repos is not None:
            target["repo"] = str(Path(local_repos).expanduser().resolve() / instance["instance_id"])
            instance = {**instance, ENV_PREBUILT: "1"}  # its environment was made here, install step included
    user = USER_PROMPT.format(repo=instance["repo"], workdir=WORKDIR,
                              problem_statement=instance["problem_statement"].strip())
    return seed_row(
        instance["instance_id"], source, agent_name, SYSTEM_PROMPT, user,
        env={"deployment": target, "post_setup_cmd": ""},
        reward={"name": "swe_bench", "metadata": {k: instance[k] for k in METADATA_FIELDS}},
    )


def build_rows(raw_rows: Iterable[Any], deployment: str, max_instances: int | None = None,
               agent_name: str = "swe_agent", local_repos: str | Path | None = None,
               image_registry: str | None = None, source: str = DATA_SOURCE,
               specs: dict[str, Any] | None = None) -> tuple[list[dict[str, Any]], list[RowProblem]]:
    """Rows for the valid instances (at most `max_instances`), and the problems of the invalid ones."""
    if deployment not in DEPLOYMENTS:
        raise ConfigError(f"unknown deployment {deployment!r}; choose one of {', '.join(DEPLOYMENTS)}")
    if source not in SOURCES:
        raise ConfigError(f"unknown source {source!r}; choose one of {', '.join(SOURCES)}")
    rows: list[dict[str, Any]] = []
    problems: list[RowProblem] = []
    seen: set[str] = set()
    for index, raw in enumerate(raw_rows):
        if max_instances is not None and len(rows) >= max_instances:
            break
        instance_id = str(raw.get("instance_id")) if isinstance(raw, dict) else "?"
        try:
            if source == "swe_smith":
                from . import smith_rows

                instance = smith_rows.normalize_instance(raw)
            else:
                instance = normalize_instance(raw, source, specs)
            if instance["instance_id"] in seen:
                raise ConfigError("duplicate instance_id")
            if source == "swe_smith":
                row = smith_rows.instance_to_row(instance, deployment, SYSTEM_PROMPT, agent_name, local_repos,
                                                  image_registry)
            else:
                row = instance_to_row(instance, deployment, agent_name, local_repos, image_registry, source)
        except ConfigError as exc:  # this row is left out, with why; the others go on
            problems.append(RowProblem(index, instance_id, str(exc)))
            continue
        seen.add(instance["instance_id"])
        rows.append(row)
    return rows, problems


def output_path(save_dir: str | Path, deployment: str, source: str = DATA_SOURCE) -> Path:
    return Path(save_dir).expanduser() / f"{source}_{deployment}.parquet"


def preprocess(save_dir: str | Path, input_path: str | Path | None = None, deployment: str | None = None,
               max_instances: int | None = None, hub_name: str | None = None, split: str | None = None,
               agent_name: str = "swe_agent", local_repos: str | Path | None = None,
               image_registry: str | None = None, source: str = DATA_SOURCE,
               specs_path: str | Path | None = None) -> tuple[Path, int, list[RowProblem]]:
    """Write DIR/<source>_<deployment>.parquet; returns (path, rows written, problems)."""
    if source not in SOURCES:
        raise ConfigError(f"unknown source {source!r}; choose one of {', '.join(SOURCES)}")
    hub_name, split = hub_name or SOURCES[source][0], split or SOURCES[source][1]
    specs = load_specs(specs_path)
    import pyarrow as pa
    import pyarrow.parquet as pq

    deployment = deployment or os.environ.get("DEPLOYMENT") or "modal"
    if deployment not in DEPLOYMENTS:
        raise ConfigError(f"unknown deployment {deployment!r}; choose one of {', '.join(DEPLOYMENTS)}")
    if max_instances is not None and max_instances < 0:
        max_instances = None  # -1: all
    rows, problems = build_rows(read_instances(input_path, hub_name, split), deployment, max_instances, agent_name,
                                local_repos, image_registry, source, specs)
    if not rows:
        raise ConfigError(f"no valid instances in {input_path or hub_name}: "
                          + ("; ".join(map(str, problems[:5])) or "the input is empty"))
    path = output_path(save_dir, deployment, source)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    os.replace(tmp, path)
    return path, len(rows), problems


def main(argv: list[str] | None = None) -> int:
    """The `preprocess-swe` command (also examples/data_preprocess/swe_bench_verified.py)."""
    import argparse

    parser = argparse.ArgumentParser(prog="swe_bench_verified.py", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run_cli(parser.parse_args(argv))


def add_arguments(parser: Any) -> None:
    parser.add_argument("--source", choices=tuple(SOURCES), default=DATA_SOURCE,
                        help="the dataset the rows come from (default: swe_bench_verified)")
    parser.add_argument("--local-save-dir", default="~/data/swe_agent",
                        help="where <source>_<deployment>.parquet is written (default: ~/data/swe_agent)")
    parser.add_argument("--input", help="a local .parquet/.jsonl/.json file with the dataset's published fields "
                                        "(default: the source's hub dataset, e.g. " + HUB_NAME + ")")
    parser.add_argument("--specs", help="swe_gym: a JSON spec file, repo → version (or \"*\") → {test_cmd, log_parser, "
                                        "install, eval_commands}, for repositories swebench's table lacks")
    parser.add_argument("--deployment", choices=DEPLOYMENTS,
                        help="image naming: modal, docker, podman, vefaas or local (default: $DEPLOYMENT, else modal)")
    parser.add_argument("--max-instances", type=int, help="write at most K instances (the first K valid ones)")
    parser.add_argument("--dataset-name", help="the hub name used when --input is not given (default: the source's)")
    parser.add_argument("--split", help="the hub split (default: the source's: test, or train for SWE-Gym/SWE-smith)")
    parser.add_argument("--agent-name", default="swe_agent", help="agent_name of every row")
    parser.add_argument("--local-repos", help="deployment local: DIR/<instance_id> holds each repository, run on "
                                              "the host's filesystem (without it, local rows name the instance "
                                              "image, run by bubblewrap over its root filesystem) "
                                              "(swe_smith: DIR/<owner>__<repo>.<commit8>, the clean repository)")
    parser.add_argument("--image-registry", help="put a registry in front of the image name (modal/docker/podman), "
                                                 "e.g. docker.io for podman without unqualified-search registries")


def run_cli(args: Any) -> int:
    try:
        path, count, problems = preprocess(
            args.local_save_dir, args.input, args.deployment, args.max_instances, args.dataset_name, args.split,
            args.agent_name, args.local_repos, args.image_registry, getattr(args, "source", DATA_SOURCE),
            getattr(args, "specs", None))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for problem in problems:
        print(f"skipped malformed {problem}", file=sys.stderr)
    print(f"wrote {count} instances to {path}" + (f" ({len(problems)} malformed rows skipped)" if problems else ""))
    return 0


if __name__ == "__main__":  # python -m uni_agent.swebench.preprocess ...
    sys.exit(main())
