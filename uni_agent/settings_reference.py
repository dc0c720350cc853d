"""settings/default.yaml, rendered from RunSettings: every run setting with its default and its docstring as the
comment. The defaults are written once, in uni_agent/settings.py; this file is a copy for reading and for starting a
settings file of your own, which tests/test_config.py keeps equal to the fields.

    python -m uni_agent.settings_reference > settings/default.yaml   # in a checkout, after changing a field
    python -m uni_agent.settings_reference > my-settings.yaml        # anywhere, then UNI_AGENT_SETTINGS_FILE=...
"""

from __future__ import annotations

import json
import sys
import textwrap
from typing import Any

import yaml

from .settings import RunSettings

HEADER = """\
# Every run setting with its default. Rendered from uni_agent/settings.py (RunSettings, where the defaults live) by
# `python -m uni_agent.settings_reference`: change a default there, then render this file again.
# Override with UNI_AGENT_<NAME> environment variables or CLI flags (e.g. UNI_AGENT_OUTPUT_DIR=/data/run1, or
# --output-dir /data/run1), or copy this file, keep the keys you change and point UNI_AGENT_SETTINGS_FILE at it.
# Unknown keys are an error, and so is an unknown UNI_AGENT_ variable (a misspelled setting).
"""
# The heading printed above the first setting of each group (the groups of the class's fields).
SECTIONS = {"data_path": "Where and what", "scheduler_address": "Dask", "engine": "LLM engine",
            "flush_every": "Output"}
COMMENT_COLUMN = 27
WIDTH = 120


def defaults() -> dict[str, Any]:
    """Each setting's default, as a settings file would write it."""
    values = {}
    for name, field in RunSettings.model_fields.items():
        values[name] = field.default_factory() if field.default_factory else field.default  # type: ignore[call-arg]
    return values


def yaml_value(value: Any) -> str:
    """`value` as one line of YAML that reads back as itself."""
    if isinstance(value, str) and yaml.safe_load(value) == value and ": " not in value and " #" not in value:
        return value
    return json.dumps(value)  # null, true, 8, 0.9, [], "a string YAML would read as something else"


def render() -> str:
    lines = [HEADER]
    for name, value in defaults().items():
        if name in SECTIONS:
            lines.append(f"\n# {SECTIONS[name]}\n")
        setting = f"{name}: {yaml_value(value)}"
        comment = " ".join((RunSettings.model_fields[name].description or "").split())
        if not comment:
            lines.append(setting + "\n")
            continue
        column = max(COMMENT_COLUMN, len(setting) + 1)
        wrapped = textwrap.wrap(comment, WIDTH - column - 2, break_on_hyphens=False)
        lines.append(f"{setting:<{column}}# {wrapped[0]}\n")
        lines.extend(f"{'':<{column}}# {line}\n" for line in wrapped[1:])
    return "".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render())
