"""One SWE-bench instance → what the official harness would run for it: image name, eval script, patch commands.

The eval script is the official one (`swebench.harness.test_spec.create_scripts.make_eval_script_list`, built from
the repo/version spec table, the test directives and the files the test patch touches), with one deliberate change
to its two "reset the test files" lines:

- swebench 4.1.0 resets with `git checkout <base_commit> <files the test patch modifies>`. When the test patch only
  *adds* files that list is empty and the line becomes a bare `git checkout <base_commit>`, which moves HEAD instead of
  resetting files (SWE-bench#518). We leave that line out in that case.
- Files the test patch *adds* are not reset by 4.1.0, so a file the agent created at such a path makes the test
  patch fail to apply and the agent's own version is run (the script has no `set -e`). We remove those paths first.

With a test patch that only modifies files, our script is byte-for-byte the official one
(tests/test_swebench_equivalence.py checks both cases against the package).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any, Mapping

from ..config import ConfigError
from . import require_swebench

WORKDIR = "/testbed"  # where the repository lives in the official images
ENV_NAME = "testbed"  # the conda environment of the official images
PATCH_PATH = "/tmp/patch.diff"  # where the official harness copies the model patch
EVAL_SCRIPT_PATH = "/tmp/eval.sh"  # the harness uses /eval.sh; /tmp is writable in every sandbox backend
# How the official harness applies a model patch: each in turn until one exits 0 (run_evaluation.GIT_APPLY_CMDS).
GIT_APPLY_CMDS = ("git apply --verbose", "git apply --verbose --reject", "patch --batch --fuzz=5 -p1 -i")
EVAL_SCRIPT_HEADER = ("#!/bin/bash", "set -uxo pipefail")  # TestSpec.eval_script's first lines
INSTANCE_IMAGE_NAMESPACE = "swebench"
VEFAAS_REGISTRY = "enterprise-public-cn-beijing.cr.volces.com/swe-bench-verified"
DEPLOYMENTS = ("modal", "docker", "podman", "vefaas", "local")
REQUIRED_FIELDS = ("instance_id", "repo", "version", "base_commit", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS")


def test_list(value: Any, field: str = "tests") -> list[str]:
    """FAIL_TO_PASS / PASS_TO_PASS: a JSON string (as in the official dataset) or a list of test ids."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{field} is not a JSON list: {exc}") from None
    if hasattr(value, "tolist"):  # a numpy array from a Parquet list column
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not all(isinstance(t, str) for t in value):
        raise ConfigError(f"{field} must be a list of test ids (or a JSON string of one)")
    return list(value)


def image_name(instance_id: str, deployment: str, registry: str | None = None) -> str | None:
    """The instance image for a deployment; `local` has none (it runs on the host's filesystem).

    `org__repo-N` → `swebench/sweb.eval.x86_64.org_1776_repo-n` (lower-cased), the official harness's remote image
    name without its `:latest` tag; vefaas uses the volces mirror of the same images, tag `v2`. `registry` (e.g.
    `docker.io`, or a mirror) is put in front for modal/docker/podman: podman without unqualified-search registries
    (Debian's default) cannot resolve the short name.
    """
    if deployment not in DEPLOYMENTS:
        raise ConfigError(f"unknown deployment {deployment!r}; choose one of {', '.join(DEPLOYMENTS)}")
    if "__" not in instance_id:
        raise ConfigError(f"instance_id {instance_id!r} is not of the form <org>__<repo>-<number>")
    key = f"sweb.eval.x86_64.{instance_id.lower()}".replace("__", "_1776_")
    if deployment == "local":
        return None
    if deployment == "vefaas":
        return f"{VEFAAS_REGISTRY}/{key}:v2"
    name = f"{INSTANCE_IMAGE_NAMESPACE}/{key}"
    return f"{registry.rstrip('/')}/{name}" if registry else name


@dataclass(frozen=True)
class TestFiles:
    modified: list[str]  # exist at base_commit: reset with `git checkout <base_commit> ...`
    added: list[str]  # created by the test patch: removed before it is applied


def test_files(test_patch: str) -> TestFiles:
    """Files the test patch touches, split the way the reset needs (modified/deleted vs added)."""
    require_swebench()
    from swebench.harness.utils import get_modified_files
    from unidiff import PatchSet  # a dependency of swebench

    modified = get_modified_files(test_patch)  # the official list: every file with a source side
    added = [f.path for f in PatchSet(test_patch) if f.is_added_file]
    return TestFiles(modified=modified, added=[f for f in added if f not in modified])


def repo_spec(instance: Mapping[str, Any]) -> dict[str, Any]:
    """The official per-repo/version spec (test_cmd, install, eval_commands, ...); an unknown pair is an error."""
    require_swebench()
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS

    repo, version = instance["repo"], instance["version"]
    if repo not in MAP_REPO_VERSION_TO_SPECS:
        raise ConfigError(f"repo {repo!r} is not in swebench's spec table (MAP_REPO_VERSION_TO_SPECS)")
    versions = MAP_REPO_VERSION_TO_SPECS[repo]
    if not isinstance(version, str) or version not in versions:
        raise ConfigError(f"version {version!r} is not a known version of {repo} (known: {', '.join(versions)})")
    return versions[version]


def _reset_lines(official_line: str, files: TestFiles) -> list[str]:
    lines = [official_line] if files.modified else []  # no bare `git checkout <commit>` (SWE-bench#518)
    if files.added:
        lines.append("rm -rf -- " + " ".join(shlex.quote(f) for f in files.added))
    return lines


def eval_script(instance: Mapping[str, Any]) -> str:
    """The eval script for an instance (see the module docstring for how it differs from 4.1.0's, and when)."""
    return "\n".join([*EVAL_SCRIPT_HEADER, *eval_script_list(instance)]) + "\n"


def eval_script_list(instance: Mapping[str, Any]) -> list[str]:
    """The eval script's commands, one per entry (an entry may span lines: the test patch's heredoc)."""
    spec = repo_spec(instance)
    from swebench.harness.test_spec.create_scripts import make_eval_script_list

    base_commit, test_patch = instance["base_commit"], instance["test_patch"]
    official = make_eval_script_list(dict(instance), spec, ENV_NAME, WORKDIR, base_commit, test_patch)
    files = test_files(test_patch)
    official_reset = f"git checkout {base_commit} {' '.join(files.modified)}"
    resets = [i for i, line in enumerate(official) if line == official_reset]
    if len(resets) != 2:  # the package's script changed shape: refuse rather than guess
        raise RuntimeError(f"swebench's eval script for {instance['instance_id']} has {len(resets)} reset lines "
                           f"{official_reset!r}, expected 2; uni-agent needs updating for this swebench version")
    lines: list[str] = []
    for i, line in enumerate(official):
        lines.extend(_reset_lines(line, files) if i in resets else [line])
    return lines


def official_test_spec(instance: Mapping[str, Any]):
    """A swebench `TestSpec` for grading (repo, version, tests, our eval script), built offline.

    `make_test_spec` would also build the image setup scripts, which download requirements/environment files from
    GitHub for many repos; grading needs none of them, so those lists stay empty here.
    """
    spec = repo_spec(instance)
    from swebench.harness.constants import MAP_REPO_TO_EXT
    from swebench.harness.test_spec.test_spec import TestSpec

    return TestSpec(
        instance_id=instance["instance_id"], repo=instance["repo"], version=instance["version"],
        repo_script_list=[], env_script_list=[], eval_script_list=eval_script_list(instance),
        arch="x86_64", FAIL_TO_PASS=test_list(instance["FAIL_TO_PASS"], "FAIL_TO_PASS"),
        PASS_TO_PASS=test_list(instance["PASS_TO_PASS"], "PASS_TO_PASS"),
        language=MAP_REPO_TO_EXT[instance["repo"]], docker_specs=spec.get("docker_specs", {}),
        namespace=INSTANCE_IMAGE_NAMESPACE,
    )
