"""The official instances of SWE-bench Verified, SWE-Gym and SWE-rebench as preprocess.py reads them: from a local
Parquet / JSONL / JSON file or the hub, each row's official fields checked and made strings (`normalize_instance`),
and SWE-Gym's spec file (`load_specs`). A row that fails the check raises ConfigError saying what is wrong; making
rows of the checked instances is preprocess.py's.
"""

from __future__ import annotations

import json
from pathlib import Path
from collections.abc import Iterable
from typing import Any

from ..config import ConfigError
from ..tasks.rows import test_list
from .spec import ENV_PREBUILT, REQUIRED_FIELDS, image_name, log_parser, repo_spec, row_spec, test_files

HUB_NAME = "princeton-nlp/SWE-bench_Verified"
DATA_SOURCE = "swe_bench_verified"
# The official fields kept in reward.metadata, all as strings (FAIL_TO_PASS / PASS_TO_PASS as JSON strings, as
# in the official dataset), so every row has the same Parquet type. Optional ones default to "".
INPUT_FIELDS = REQUIRED_FIELDS + ("patch", "problem_statement")  # the prompt and gold verification need these too
OPTIONAL_FIELDS = ("hints_text", "created_at", "environment_setup_commit", "difficulty", ENV_PREBUILT)
# A row's own test spec (SWE-Gym: from --specs; SWE-rebench: install_config) and image, as JSON / strings.
SPEC_FIELDS = ("spec", "install_config", "docker_image")
METADATA_FIELDS = INPUT_FIELDS + OPTIONAL_FIELDS + SPEC_FIELDS


def read_instances(path: str | Path | None, hub_name: str = HUB_NAME, split: str = "test") -> list[Any]:
    """Input rows from a local .parquet / .jsonl / .json file, or from the hub when no path is given."""
    if path is None:
        return _from_hub(hub_name, split)
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"{path}: input file not found")
    suffix = "".join(path.suffixes[-1:]).lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if suffix in (".jsonl", ".ndjson"):
        rows = []
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{path}:{number}: not valid JSON: {exc}") from None
        return rows
    if suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not valid JSON: {exc}") from None
        if isinstance(data, dict):  # {"test": [...]} / {"rows": [...]} / {"data": [...]}
            lists = [v for k, v in data.items() if k in (split, "rows", "data") and isinstance(v, list)]
            data = lists[0] if lists else None
        if not isinstance(data, list):
            raise ConfigError(f"{path}: expected a JSON list of instances")
        return data
    raise ConfigError(f"{path}: unsupported input format {suffix or '(none)'}; use .parquet, .jsonl or .json")


def _from_hub(hub_name: str, split: str) -> list[Any]:
    try:
        from datasets import load_dataset
    except ImportError:
        raise ConfigError(f"reading {hub_name} from the Hugging Face hub needs the `datasets` package (pip install "
                          "'uni-agent[swebench]'); or pass --input FILE (.parquet, .jsonl or .json)") from None
    try:
        return list(load_dataset(hub_name, split=split))
    except Exception as exc:  # offline, unknown name, auth: all end the same way for the user
        raise ConfigError(f"could not load {hub_name} (split {split}) from the Hugging Face hub: "
                          f"{type(exc).__name__}: {exc}. Without network access, download the dataset elsewhere "
                          "(e.g. its Parquet file) and pass --input FILE (.parquet, .jsonl or .json)") from None


def checked_strings(raw: Any, required: Iterable[str], strings: Iterable[str]) -> dict[str, str]:
    """The start of checking one input row (every source's): a mapping, none of `required` missing, each of
    `strings` a non-empty string; returns those strings. ConfigError says what is wrong."""
    if not isinstance(raw, dict):
        raise ConfigError(f"expected a mapping of fields, got {type(raw).__name__}")
    missing = [f for f in required if raw.get(f) is None]
    if missing:
        raise ConfigError(f"missing fields {missing}")
    out: dict[str, str] = {}
    for name in strings:
        if not isinstance(raw[name], str) or not raw[name].strip():
            raise ConfigError(f"{name} must be a non-empty string")
        out[name] = raw[name]
    return out


def normalize_instance(raw: Any, source: str = DATA_SOURCE, specs: dict[str, Any] | None = None) -> dict[str, str]:
    """The official fields of one input row, checked and as strings; ConfigError says what is wrong."""
    out = checked_strings(raw, INPUT_FIELDS,
                          ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement"))
    version = raw["version"]
    if isinstance(version, (int, float)) and not isinstance(version, bool):
        version = str(version)  # a JSON number; "0.20" read as 0.2 will then fail the version check below
    if not isinstance(version, str):
        raise ConfigError("version must be a string such as '3.0'")
    out["version"] = version
    for name in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        out[name] = json.dumps(test_list(raw[name], name))
    if not json.loads(out["FAIL_TO_PASS"]):
        raise ConfigError("FAIL_TO_PASS is empty: there is nothing to grade")
    for name in OPTIONAL_FIELDS:
        value = raw.get(name)
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{name} must be a string, got {type(value).__name__}")
        out[name] = value or ""
    image_name(out["instance_id"], "docker")  # <org>__<repo>-<n>
    for name in SPEC_FIELDS:
        out[name] = ""
    if source == "swe_rebench":
        if raw.get("install_config") in (None, ""):
            raise ConfigError("missing field install_config (SWE-rebench's per-instance test command and parser)")
        config = raw["install_config"]
        out["install_config"] = config if isinstance(config, str) else json.dumps(config)
        if raw.get("docker_image") is not None and not isinstance(raw["docker_image"], str):
            raise ConfigError("docker_image must be a string")
        out["docker_image"] = raw.get("docker_image") or ""
    elif source == "swe_gym":
        out["spec"] = _gym_spec(out, specs)
    row_spec(out)  # a row's own spec is well-formed (install_config.test_cmd, ...)
    repo_spec(out)  # the swebench package knows this repo and version, or the row carries its spec
    log_parser(out)  # and the log parser exists
    files = test_files(out["test_patch"])
    if not files.modified and not files.added:
        raise ConfigError("test_patch is not a unified diff touching any file")
    return out


def _gym_spec(instance: dict[str, str], specs: dict[str, Any] | None) -> str:
    """A SWE-Gym row's test spec as JSON: from the spec file (repo → version or "*" → spec); "" when swebench's
    own table has the repo/version."""
    from . import require_swebench

    require_swebench()
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS

    repo, version = instance["repo"], instance["version"]
    by_version = (specs or {}).get(repo)
    if isinstance(by_version, dict) and (version in by_version or "*" in by_version):
        spec = dict(by_version.get(version, by_version.get("*")))
        if repo == "python/mypy":  # SWE-Gym's harness runs mypy's cases named in the test patch, not test files
            spec.setdefault("test_directives", "mypy_cases")
        return json.dumps(spec)
    if version in MAP_REPO_VERSION_TO_SPECS.get(repo, {}):
        return ""
    raise ConfigError(f"repo/version {repo} {version}: no test spec (swebench 4.1.0's table does not have SWE-Gym's "
                      "repositories); give one in --specs FILE: {\"<repo>\": {\"<version>\" or \"*\": "
                      "{\"test_cmd\": ..., \"log_parser\": \"parse_log_pytest\", \"install\": ..., "
                      "\"eval_commands\": [...]}}}")


def load_specs(path: str | Path | None) -> dict[str, Any] | None:
    """A SWE-Gym spec file: JSON, repo → version (or "*") → spec."""
    if path is None:
        return None
    path = Path(path).expanduser()
    try:
        specs = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: spec file not found") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(specs, dict) or not all(isinstance(v, dict) for v in specs.values()):
        raise ConfigError(f"{path}: expected {{repo: {{version or \"*\": spec}}}}")
    return specs
