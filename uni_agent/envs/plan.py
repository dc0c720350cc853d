"""What `uni-agent envs build` makes, decided from the rows alone: one environment per (repo, version, spec, setup
commit) and, for each row, its repository's preparation. Nothing here runs a process, so the plan is unit-tested
without network, mirrors or interpreters.

The facts are swebench 4.1.0's (the spec of each repo/version in MAP_REPO_VERSION_TO_SPECS, or a row's own spec):
- `python`: the interpreter version of the environment;
- `packages`: "requirements.txt" means the repository's requirements file at environment_setup_commit (its
  MAP_REPO_TO_REQS_PATHS, `-r` files inlined, lines starting with `-e .`, `#` or `.[test` left out); "environment.yml"
  needs conda and is refused here; anything else is a list of conda package names, installed with pip by the same
  names;
- `pip_packages`: installed with pip after those;
- `pre_install` and `install`: run in the repository (/testbed), for the environment at environment_setup_commit and
  again for each row at its base_commit (the official images run them per instance).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from ..config import ConfigError
from ..swebench.spec import repo_spec

ENV_NAME = "testbed"
CONDA_ROOT = "/opt/miniconda3"  # where the official images' eval scripts look for `activate` and the env
ENV_PREFIX = f"{CONDA_ROOT}/envs/{ENV_NAME}"
REQUIREMENTS_FILE = "/tmp/uni-agent-requirements.txt"  # inside the build sandbox
# Requirements lines the official harness drops (the editable install of the repository itself, comments).
SKIPPED_REQUIREMENT_PREFIXES = ("-e .", "#", ".[test")
# Requirements the official harness replaces (yanked from PyPI): name → replacement, None to drop.
REPLACED_REQUIREMENTS = {"types-pkg_resources": "types-setuptools"}
ACTIVATE = f"source {CONDA_ROOT}/bin/activate && conda activate {ENV_NAME}"
LAYOUT = 3  # how build.py lays an environment out; part of every key, so a new layout never reuses an old build


@dataclass(frozen=True)
class EnvPlan:
    """One environment: the spec of a repo/version, built from the repository at `setup_commit`."""

    repo: str
    version: str
    python: str
    setup_commit: str
    packages: str = ""
    pip_packages: tuple[str, ...] = ()
    pre_install: tuple[str, ...] = ()
    install: str = ""
    requirements_paths: tuple[str, ...] = ()
    constraints: str = ""  # pip constraints for every install of the build (`envs build --constraint`), as text

    @property
    def key(self) -> str:
        """The cache directory's name: readable, and different whenever anything the build uses differs."""
        fields = {k: v for k, v in self.__dict__.items() if v or k != "constraints"}  # none: keys as before them
        what = json.dumps({**fields, "layout": LAYOUT}, sort_keys=True, default=list)
        digest = hashlib.sha256(what.encode()).hexdigest()[:10]
        return f"{self.repo.replace('/', '__')}-{self.version}-{digest}"

    @property
    def label(self) -> str:
        return f"{self.repo} {self.version}"

    def build_script(self, requirements: str | None) -> str:
        """The bash script that fills the environment (a copy of the interpreter at ENV_PREFIX, build.make_prefix)
        in the build sandbox (the repository at /testbed, the environment at CONDA_ROOT, the network on).
        `requirements`: the text of the requirements file for `packages: requirements.txt`."""
        lines = ["set -euxo pipefail", ACTIVATE, "python -m ensurepip --default-pip", "cd /testbed"]
        if self.packages == "requirements.txt":
            if requirements is None:
                raise ConfigError(f"{self.label}: packages: requirements.txt, but no requirements file was read")
            lines += [f"cat > {REQUIREMENTS_FILE} <<'UA_REQUIREMENTS_EOF'\n{requirements}\nUA_REQUIREMENTS_EOF",
                      f"python -m pip install -r {REQUIREMENTS_FILE}"]
        elif self.packages:
            lines.append("python -m pip install " + " ".join(shlex.quote(p) for p in self.packages.split()))
        if self.pip_packages:
            lines.append("python -m pip install " + " ".join(shlex.quote(p) for p in self.pip_packages))
        return "\n".join(lines + list(self.pre_install) + ([self.install] if self.install else [])) + "\n"


@dataclass(frozen=True)
class InstancePlan:
    """One row's repository: checked out at base_commit, then the spec's pre_install and install run over it
    (with the environment writable only for the moment: what install writes there is thrown away)."""

    instance_id: str
    repo: str
    base_commit: str
    env: EnvPlan

    def prepare_script(self) -> str:
        steps = list(self.env.pre_install) + ([self.env.install] if self.env.install else [])
        return "\n".join(["set -euxo pipefail", ACTIVATE, "cd /testbed", *steps]) + "\n"


@dataclass
class Plan:
    envs: dict[str, EnvPlan] = field(default_factory=dict)  # by key
    instances: dict[int, InstancePlan] = field(default_factory=dict)  # by row index
    problems: list[str] = field(default_factory=list)  # rows left out, with why


def metadata_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row's reward.metadata (the official fields)."""
    return dict(((row.get("extra_info") or {}).get("tools_kwargs") or {}).get("reward", {}).get("metadata") or {})


def deployment_of(row: Mapping[str, Any]) -> dict[str, Any]:
    return dict(((row.get("extra_info") or {}).get("tools_kwargs") or {}).get("env", {}).get("deployment") or {})


def env_plan(instance: Mapping[str, Any], requirements_paths: Callable[[str], Iterable[str]],
             constraints: str = "") -> EnvPlan:
    """The environment an instance (its official fields) needs; ConfigError says why there is none."""
    spec = repo_spec(instance)
    setup_commit = str(instance.get("environment_setup_commit") or "")
    if not setup_commit:
        raise ConfigError("no environment_setup_commit")
    if "python" not in spec:
        raise ConfigError(f"the spec of {instance['repo']} {instance['version']} names no python version")
    packages = str(spec.get("packages") or "")
    if packages == "environment.yml":
        raise ConfigError(f"{instance['repo']} {instance['version']}: its spec installs from environment.yml, "
                          "which needs conda; uni-agent envs builds pip environments only")
    return EnvPlan(
        repo=instance["repo"], version=instance["version"], python=str(spec["python"]), setup_commit=setup_commit,
        packages=packages, pip_packages=tuple(spec.get("pip_packages") or ()),
        pre_install=tuple(spec.get("pre_install") or ()), install=str(spec.get("install") or ""),
        requirements_paths=tuple(requirements_paths(instance["repo"])) if packages == "requirements.txt" else (),
        constraints=constraints)


def official_requirements_paths(repo: str) -> list[str]:
    """Where swebench 4.1.0 looks for a repository's requirements file."""
    from swebench.harness.constants.python import MAP_REPO_TO_REQS_PATHS

    return list(MAP_REPO_TO_REQS_PATHS.get(repo, ["requirements.txt"]))


def plan_rows(rows: Iterable[Mapping[str, Any]],
              requirements_paths: Callable[[str], Iterable[str]] = official_requirements_paths,
              constraints: str = "") -> Plan:
    """The environments and repositories the rows need. Rows that are not SWE-bench rows of the local backend
    are left out with a reason; so are rows whose spec cannot be built here. `constraints`: pip constraints (a
    constraints file's text) for every install, e.g. pins for packages released after the official images."""
    plan = Plan()
    for index, row in enumerate(rows):
        instance = metadata_of(row)
        name = instance.get("instance_id") or row.get("instance_id") or f"row {index}"
        if deployment_of(row).get("type", "local") != "local":
            plan.problems.append(f"{name}: deployment {deployment_of(row).get('type')!r}: only local rows get "
                                 "environments from this machine (the other backends run the official images)")
            continue
        try:
            env = env_plan(instance, requirements_paths, constraints)
        except (ConfigError, KeyError) as exc:
            plan.problems.append(f"{name}: {exc}")
            continue
        plan.envs.setdefault(env.key, env)
        plan.instances[index] = InstancePlan(instance["instance_id"], instance["repo"], instance["base_commit"], env)
    return plan


def requirements_text(read: Callable[[str], str | None], paths: Iterable[str]) -> str:
    """The requirements the official harness installs: the first of `paths` that exists (read(path) → its text at
    environment_setup_commit, None when absent), its `-r` files inlined before its own lines, the official harness's
    skips and replacements applied."""
    for path in paths:
        text = read(path)
        if text is not None:
            break
    else:
        raise ConfigError(f"no requirements file at any of {list(paths)}")
    folder = path.rsplit("/", 1)[0] if "/" in path else ""
    included, own = [], []
    for line in text.split("\n"):
        if line.strip().startswith("-r"):
            name = line.strip()[2:].strip()
            extra = read(f"{folder}/{name}" if folder else name) or ""
            included += [x for x in extra.split("\n") if not x.strip().startswith(SKIPPED_REQUIREMENT_PREFIXES)]
        elif not line.strip().startswith(SKIPPED_REQUIREMENT_PREFIXES):
            own.append(line)
    lines = [*included, "\n".join(own)]
    return "\n".join(_replaced(line) for line in "\n".join(lines).split("\n"))


def _replaced(line: str) -> str:
    for name, replacement in REPLACED_REQUIREMENTS.items():
        rest = line[len(name):]
        if line.startswith(name) and (not rest or rest[0] in "<>=!~"):
            return replacement or ""
    return line
