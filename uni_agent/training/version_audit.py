"""Are a batch's policy versions consistent? What a trainer checks before it trusts the rows' version columns.

    audit = audit_versions(results, current_version=service.version, max_staleness=1)
    assert audit["inconsistent"] == 0

Per row (a RolloutResult or its dict), over its sampled tokens (token_versions >= 0):
    ordered       the versions never go down along the sequence (a rollout that spans an update: old, then new)
    from_asked    every one is >= the policy_version the batch asked for (no token of an older policy)
    known         every one is <= the service's current version (no token of a version that never served)
    bounds        version_min / version_max are the least / greatest of them
    staleness     current_version - version_min; a row past max_staleness must be masked (staleness_action)
A row failing any of the first four counts as inconsistent. Pure: no I/O, no torch.
"""

from __future__ import annotations

from collections import Counter
from typing import Any


def audit_versions(rows: list[Any], *, current_version: int, max_staleness: int | None = None) -> dict[str, Any]:
    """Counts over `rows` (see the module doc); `tokens_per_version` sums the sampled tokens by version."""
    out: dict[str, Any] = {"rollouts": 0, "with_tokens": 0, "spanning": 0, "inconsistent": 0, "max_staleness": 0,
                           "stale_unmasked": 0, "masked_stale": 0, "problems": []}
    tokens: Counter[int] = Counter()
    for row in rows:
        get = row.get if isinstance(row, dict) else lambda k, r=row: getattr(r, k, None)
        out["rollouts"] += 1
        versions = [int(v) for v in (get("token_versions") or []) if int(v) >= 0]
        if get("staleness_action") == "masked":
            out["masked_stale"] += 1
        if not versions:
            continue
        out["with_tokens"] += 1
        tokens.update(versions)
        asked = int(get("policy_version") or 0)
        checks = {
            "ordered": all(a <= b for a, b in zip(versions, versions[1:], strict=False)),
            "from_asked": min(versions) >= asked,
            "known": max(versions) <= current_version,
            "bounds": (get("version_min"), get("version_max")) == (min(versions), max(versions)),
        }
        if min(versions) != max(versions):
            out["spanning"] += 1
        staleness = current_version - min(versions)
        out["max_staleness"] = max(out["max_staleness"], staleness)
        if max_staleness is not None and staleness > max_staleness and get("staleness_action") != "masked":
            out["stale_unmasked"] += 1  # legitimate when the row finished before the version moved on
        failed = [name for name, ok in checks.items() if not ok]
        if failed:
            out["inconsistent"] += 1
            out["problems"].append(f"{get('instance_id')} #{get('rollout')}: {', '.join(failed)} "
                                   f"(asked {asked}, sampled {sorted(set(versions))})")
    out["tokens_per_version"] = dict(sorted(tokens.items()))
    return out
