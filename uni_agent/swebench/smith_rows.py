"""SWE-smith rows (SWE-bench/SWE-smith) → dataset rows in the seed schema, graded by `swe_smith`: each row checked,
its bug patch kept as `bug_patch` and its reverse as the gold `patch`, its image per repository, and the agent's
post_setup_cmd (the task state, the FAIL_TO_PASS test files removed). What SWE-smith's harness does and how we match
it: smith.py, which this module builds on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from ..config import ConfigError
from ..tasks.rows import seed_row, test_list
from .instances import checked_strings
from .smith import REWARD_NAME, agent_setup_command, check_metadata, repo_name, reverse_patch
from .spec import DEPLOYMENTS, WORKDIR

HUB_NAME = "SWE-bench/SWE-smith"
HUB_SPLIT = "train"
DATA_SOURCE = "swe_smith"
REQUIRED_FIELDS = ("instance_id", "repo", "patch", "FAIL_TO_PASS", "PASS_TO_PASS", "image_name", "problem_statement")
OPTIONAL_FIELDS = ("base_commit", "created_at", "test_cmd", "log_parser")

USER_PROMPT = """The Python repository {repo} is checked out at {workdir}, with its dependencies installed.
A user reported this issue:

<issue>
{problem_statement}
</issue>

Fix the issue by changing the non-test source files under {workdir}. The repository's own tests check the
behaviour; do not modify them. A good way to work:
1. Find the code involved (`execute_bash` with grep, find, ls; `str_replace_editor` with `view`).
2. Reproduce the problem with a short script in /tmp run with `execute_bash`, or run the closest existing tests.
3. Make the smallest correct change with `str_replace_editor`.
4. Run your script and the tests again to confirm the fix and that nothing else broke.
When you are done, call `submit`. Your changes to {workdir} are your answer."""



def normalize_instance(raw: Any) -> dict[str, str]:
    """The fields of one SWE-smith row, checked, as strings (test lists as JSON strings); ConfigError names the
    field that is wrong."""
    out = checked_strings(raw, REQUIRED_FIELDS, ("instance_id", "repo", "patch", "image_name", "problem_statement"))
    for name in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        out[name] = json.dumps(test_list(raw[name], name))
    for name in OPTIONAL_FIELDS:
        value = raw.get(name)
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{name} must be a string, got {type(value).__name__}")
        out[name] = value or ""
    out["bug_patch"] = out.pop("patch")
    out["patch"] = reverse_patch(out["bug_patch"])  # the gold answer
    check_metadata(out)
    return out


def image_for(instance: Mapping[str, str], deployment: str, registry: str | None = None) -> str | None:
    if deployment not in DEPLOYMENTS:
        raise ConfigError(f"unknown deployment {deployment!r}; choose one of {', '.join(DEPLOYMENTS)}")
    if deployment == "local":
        return None
    if deployment == "vefaas":
        raise ConfigError(f"image_name {instance['image_name']!r} cannot be used for deployment vefaas: there is no "
                          "known vefaas mirror of SWE-smith's images (use modal, docker or podman)")
    image = instance["image_name"]
    return f"{registry.rstrip('/')}/{image}" if registry else image


def instance_to_row(instance: dict[str, str], deployment: str, system_prompt: str, agent_name: str = "swe_agent",
                    local_repos: str | Path | None = None, image_registry: str | None = None) -> dict[str, Any]:
    """`system_prompt`: the SWE system prompt, from preprocess.py (which imports this module, not the other way)."""
    image = image_for(instance, deployment, image_registry)
    target: dict[str, Any] = {"type": deployment}
    if image is not None:
        target["image"] = image
    else:  # local: the clean repository of this task's repo/commit, one checkout per SWE-smith repository
        target["workdir"] = WORKDIR
        if local_repos is not None:
            target["repo"] = str(Path(local_repos).expanduser().resolve() / repo_name(instance))
    user = USER_PROMPT.format(repo=repo_name(instance), workdir=WORKDIR,
                              problem_statement=instance["problem_statement"].strip())
    return seed_row(instance["instance_id"], DATA_SOURCE, agent_name, system_prompt, user,
                    env={"deployment": target, "post_setup_cmd": agent_setup_command(instance)},
                    reward={"name": REWARD_NAME, "metadata": instance})
