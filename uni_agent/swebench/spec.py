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
import re
import shlex
from dataclasses import dataclass
from typing import Any, Mapping

from ..config import ConfigError
from ..tasks.rows import test_list
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
# reward.metadata key: "1" when the row's environment was made by `uni-agent envs build` (uni_agent/envs/), whose
# build already ran the spec's install step. The eval script then skips it: offline it can only fail (pip retries the
# network for ~10 s), and the editable install it would redo is already in place.
ENV_PREBUILT = "env_prebuilt"
INSTALL_SKIPPED = ": 'the install step ran when the environment was built (uni-agent envs build)'"


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


# SWE-rebench's harness prefixes its install and test commands with this locale (its load_swebench_dataset does).
REBENCH_LOCALE = "LANG=C.UTF-8 LC_ALL=C.UTF-8 "


def row_spec(instance: Mapping[str, Any]) -> dict[str, Any] | None:
    """The test spec a row carries itself, or None (the package's table applies).

    - `spec`: a JSON object (test_cmd, log_parser, optional install / eval_commands), from a spec file given at
      preprocessing (SWE-Gym's repos are not in swebench 4.1.0's table);
    - `install_config`: SWE-rebench's per-instance config (a JSON object or its string), cleaned as SWE-rebench's
      harness fork cleans it: None values dropped, the C.UTF-8 locale put in front of `install` and `test_cmd`.
    """
    for field in ("spec", "install_config"):
        raw = instance.get(field)
        if raw in (None, ""):
            continue
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{field} is not valid JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{field} must be a JSON object, got {type(raw).__name__}")
        spec = {k: v for k, v in raw.items() if v is not None}
        if not isinstance(spec.get("test_cmd"), str) or not spec["test_cmd"].strip():
            raise ConfigError(f"{field}.test_cmd must be a non-empty string (the test command), got "
                              f"{type(spec.get('test_cmd')).__name__}")
        if not isinstance(spec.get("log_parser"), str):
            raise ConfigError(f"{field}.log_parser must name a swebench log parser (e.g. parse_log_pytest)")
        if "install" in spec and not isinstance(spec["install"], str):
            raise ConfigError(f"{field}.install must be a string")
        if not isinstance(spec.get("eval_commands", []), list):
            raise ConfigError(f"{field}.eval_commands must be a list of commands")
        if field == "install_config":
            spec["test_cmd"] = REBENCH_LOCALE + spec["test_cmd"]
            if "install" in spec:
                spec["install"] = REBENCH_LOCALE + spec["install"]
        return spec
    return None


def repo_spec(instance: Mapping[str, Any]) -> dict[str, Any]:
    """The test spec: the row's own (row_spec), else the official per-repo/version one (test_cmd, install,
    eval_commands, ...); an unknown repo/version is an error."""
    own = row_spec(instance)
    if own is not None:
        return own
    require_swebench()
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS

    repo, version = instance["repo"], instance["version"]
    if repo not in MAP_REPO_VERSION_TO_SPECS:
        raise ConfigError(f"repo {repo!r} is not in swebench's spec table (MAP_REPO_VERSION_TO_SPECS); "
                          "a row of another dataset must carry its own spec (spec / install_config)")
    versions = MAP_REPO_VERSION_TO_SPECS[repo]
    if not isinstance(version, str) or version not in versions:
        raise ConfigError(f"version {version!r} is not a known version of {repo} (known: {', '.join(versions)})")
    return versions[version]


def log_parser(instance: Mapping[str, Any]):
    """The official log parser for a row: named by its own spec (`log_parser`: a parser function of
    swebench.harness.log_parsers, e.g. parse_log_pytest, or a repository key of MAP_REPO_TO_PARSER), else the
    repository's entry in MAP_REPO_TO_PARSER. Unknown: a ConfigError naming the field."""
    require_swebench()
    from swebench.harness.log_parsers import MAP_REPO_TO_PARSER

    own = row_spec(instance)
    if own is None:
        if instance["repo"] not in MAP_REPO_TO_PARSER:
            raise ConfigError(f"repo {instance['repo']!r} has no log parser in swebench (MAP_REPO_TO_PARSER)")
        return MAP_REPO_TO_PARSER[instance["repo"]]
    name = own["log_parser"]
    parsers = _named_parsers()
    if name in MAP_REPO_TO_PARSER:
        return MAP_REPO_TO_PARSER[name]
    if name not in parsers:
        raise ConfigError(f"log_parser {name!r} is not a swebench log parser (known: {', '.join(sorted(parsers))}, "
                          "or a repository key of MAP_REPO_TO_PARSER)")
    return parsers[name]


def _named_parsers() -> dict[str, Any]:
    """Every `parse_log_*` function of swebench's log parser modules, by name (SWE-rebench names them so)."""
    import importlib
    import pkgutil

    import swebench.harness.log_parsers as package

    found: dict[str, Any] = {}
    for module_info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{module_info.name}")
        found.update({n: f for n, f in vars(module).items() if n.startswith("parse_log_") and callable(f)})
    return found


def _reset_lines(official_line: str, files: TestFiles) -> list[str]:
    lines = [official_line] if files.modified else []  # no bare `git checkout <commit>` (SWE-bench#518)
    if files.added:
        lines.append("rm -rf -- " + " ".join(shlex.quote(f) for f in files.added))
    return lines


def eval_script(instance: Mapping[str, Any]) -> str:
    """The eval script for an instance (see the module docstring for how it differs from 4.1.0's, and when)."""
    return "\n".join([*EVAL_SCRIPT_HEADER, *eval_script_list(instance)]) + "\n"


def install_step(instance: Mapping[str, Any]) -> str | None:
    """The spec's install command when the eval script runs it (not for a prebuilt environment), else None."""
    if str(instance.get(ENV_PREBUILT) or "") in ("1", "true"):
        return None
    return repo_spec(instance).get("install")


def eval_script_list(instance: Mapping[str, Any]) -> list[str]:
    """The eval script's commands, one per entry (an entry may span lines: the test patch's heredoc)."""
    spec = repo_spec(instance)
    base_commit, test_patch = instance["base_commit"], instance["test_patch"]
    if row_spec(instance) is not None:
        official = python_eval_script_list(instance, spec)
    else:
        from swebench.harness.test_spec.create_scripts import make_eval_script_list

        official = make_eval_script_list(dict(instance), spec, ENV_NAME, WORKDIR, base_commit, test_patch)
    files = test_files(test_patch)
    official_reset = f"git checkout {base_commit} {' '.join(files.modified)}"
    resets = [i for i, line in enumerate(official) if line == official_reset]
    if len(resets) != 2:  # the package's script changed shape: refuse rather than guess
        raise RuntimeError(f"swebench's eval script for {instance['instance_id']} has {len(resets)} reset lines "
                           f"{official_reset!r}, expected 2; uni-agent needs updating for this swebench version")
    lines: list[str] = []
    skip_install = "install" in spec and install_step(instance) is None
    for i, line in enumerate(official):
        if skip_install and i < resets[0] and line == spec["install"]:
            lines.append(INSTALL_SKIPPED)
            continue
        lines.extend(_reset_lines(line, files) if i in resets else [line])
    return lines


def python_eval_script_list(instance: Mapping[str, Any], spec: Mapping[str, Any]) -> list[str]:
    """swebench's Python eval script for a spec the package's table does not hold (SWE-rebench, SWE-Gym): the
    same commands in the same order as 4.1.0's make_eval_script_list_py, with the spec's own test_cmd, which is
    what SWE-rebench's harness fork runs, and SWE-Gym's runs with older informational lines and without the output
    markers (its grading parses the whole log with the same parsers and rule). A spec with `test_directives:
    mypy_cases` selects python/mypy's cases named in the test patch (`-k "case1 or case2"`), as SWE-Gym's harness
    does. tests/test_task_sources.py checks that this equals the package's script for Verified rows."""
    require_swebench()
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT
    from swebench.harness.test_spec.python import get_test_directives
    from swebench.harness.utils import get_modified_files

    base_commit, test_patch = instance["base_commit"], instance["test_patch"]
    delimiter = "EOF_114329324912"  # the package's heredoc delimiter for the test patch
    reset = f"git checkout {base_commit} {' '.join(get_modified_files(test_patch))}"
    activate = ["source /opt/miniconda3/bin/activate", f"conda activate {ENV_NAME}"]
    commands = [*activate, f"cd {WORKDIR}", *spec.get("eval_commands", []),
                f"git config --global --add safe.directory {WORKDIR}", f"cd {WORKDIR}",
                "git status", "git show", f"git -c core.fileMode=false diff {base_commit}", *activate]
    if "install" in spec:
        commands.append(spec["install"])
    if spec.get("test_directives") == "mypy_cases":  # SWE-Gym's harness selects mypy's data-driven cases by name
        cases = re.findall(r"\[case ([^\]]+)\]", test_patch)
        test_command = f'{spec["test_cmd"]} "{" or ".join(cases)}"'
    else:
        test_command = " ".join([spec["test_cmd"], *get_test_directives(dict(instance))])
    return commands + [reset, f"git apply -v - <<'{delimiter}'\n{test_patch}\n{delimiter}",
                       f": '{START_TEST_OUTPUT}'", test_command, f": '{END_TEST_OUTPUT}'", reset]


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
        language=MAP_REPO_TO_EXT.get(instance["repo"], "py"), docker_specs=spec.get("docker_specs", {}),
        namespace=INSTANCE_IMAGE_NAMESPACE,
    )
