"""Real SWE-bench Verified instances graded on this machine, end to end, with no container runtime and no images:

    .venv/bin/python cluster/swebench_verified.py --out /tmp/swebench-verified --git-mirror /work/.mirror

1. rows from the project's own preprocessor (uni_agent.swebench.preprocess, `--deployment local`) for the records in
   tests/fixtures/swebench_verified/instances.jsonl (where each field came from: that folder's README);
2. environments and repositories from `uni-agent envs build` (build time and disk per environment and repository);
3. `uni-agent verify --patch gold` (every instance must resolve) and `--patch empty` (none may), timed per instance;
4. every eval log parsed again by the official swebench 4.1.0 in a venv of its own (`pip install swebench==4.1.0`,
   made under --out; or --official-python), whose report must equal ours on every FAIL_TO_PASS / PASS_TO_PASS test
   and on `resolved`.

Prints one table (the figures of docs/datasets.md) and exits 1 when any check fails. The builds need the network
(pip) the first time; grading never does.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
RECORDS = REPO_ROOT / "tests" / "fixtures" / "swebench_verified" / "instances.jsonl"
CONSTRAINTS = RECORDS.with_name("constraints.txt")
UNI_AGENT = [sys.executable, "-m", "uni_agent.cli"]
MB = 1024 * 1024
OFFICIAL_EVAL_TIMEOUT_S = 1800  # run_evaluation's default timeout

# Run by the official package's interpreter: its own report for each log. make_test_spec also writes the image's
# environment script, which downloads requirements files; grading does not use it, so the downloads are stubbed.
OFFICIAL_CHECK = r"""
import json, sys
import swebench.harness.test_spec.python as p
from swebench.harness.grading import get_eval_report
from swebench.harness.test_spec.test_spec import make_test_spec
p.get_requirements_by_commit = lambda repo, commit: ""
p.get_environment_yml_by_commit = lambda repo, commit, env_name: ""
out = {}
for item in json.load(open(sys.argv[1])):
    spec = make_test_spec(item["instance"])
    prediction = {"instance_id": item["instance"]["instance_id"], "model_patch": item["patch"],
                  "model_name_or_path": "uni-agent"}
    report = get_eval_report(spec, prediction, item["log"], include_tests_status=True)
    out[item["key"]] = report[item["instance"]["instance_id"]]
json.dump(out, open(sys.argv[2], "w"))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="a new or empty directory for rows, results and logs")
    parser.add_argument("--records", default=str(RECORDS), help="SWE-bench records (JSONL)")
    parser.add_argument("--git-mirror", help="mirrors of the repositories (uni-agent envs build --git-mirror)")
    parser.add_argument("--jobs", type=int, default=3, help="environment builds at once")
    parser.add_argument("--constraint", default=str(CONSTRAINTS) if CONSTRAINTS.is_file() else None,
                        help="pip constraints for the builds (default: the fixture's constraints.txt, see its README)")
    parser.add_argument("--official-python", help="a Python with swebench==4.1.0 (default: a venv made under --out)")
    parser.add_argument("--local-workers", type=int, default=2, help="verify's worker processes")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    rows_path = preprocess(Path(args.records), out)
    envs_rows = out / "rows_envs.parquet"
    build_s = timed([*UNI_AGENT, "envs", "build", str(rows_path), "--out", str(envs_rows), "--jobs", str(args.jobs),
                     *(["--git-mirror", args.git_mirror] if args.git_mirror else []),
                     *(["--constraint", args.constraint] if args.constraint else [])], "envs build")
    official_timeouts(envs_rows)
    grades = {}
    for patch in ("gold", "empty"):
        timed([*UNI_AGENT, "verify", "--data-path", str(envs_rows), "--patch", patch, "--output-dir",
               str(out / patch), "--local-workers", str(args.local_workers)], f"verify --patch {patch}")
        grades[patch] = read_results(out / patch / f"verify_{patch}.parquet")
    official_python = args.official_python or official_venv(out / "official-venv")
    agreement = compare_with_official(official_python, envs_rows, grades, out)
    return report(envs_rows, grades, agreement, build_s)


def preprocess(records: Path, out: Path) -> Path:
    sys.path.insert(0, str(REPO_ROOT))
    from uni_agent.swebench.preprocess import preprocess as project_preprocess

    # --local-repos: local rows over this machine's filesystem; `envs build` replaces each row's repo with its own
    path, count, problems = project_preprocess(out / "data", records, "local", local_repos=out / "repos-unused")
    if problems:
        raise SystemExit(f"malformed records: {[str(p) for p in problems]}")
    print(f"{count} rows from the project's preprocessor: {path}", flush=True)
    return path


def official_timeouts(rows_path: Path) -> None:
    """The rows get the official harness's 1800 s for a test run (the local agent config allows 300 s: seaborn's
    tests took longer on a busy 2-core machine). uni-agent verify has no flag for it: the rows carry it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = pq.read_table(rows_path).to_pylist()
    for row in rows:
        tools = row["extra_info"]["tools_kwargs"]
        tools["reward"]["eval_timeout"] = OFFICIAL_EVAL_TIMEOUT_S
        tools["env"]["deployment"]["runtime_timeout"] = OFFICIAL_EVAL_TIMEOUT_S + 60
    pq.write_table(pa.Table.from_pylist(rows), rows_path)


def timed(argv: list[str], what: str) -> float:
    started = time.monotonic()
    done = subprocess.run(argv, cwd=REPO_ROOT)
    seconds = time.monotonic() - started
    print(f"{what}: exit {done.returncode} in {seconds:.1f} s", flush=True)
    if done.returncode not in (0, 1):  # verify exits 1 when not every row resolved: the table says which
        raise SystemExit(f"{what} failed (exit {done.returncode})")
    return seconds


def read_results(path: Path) -> dict[str, dict]:
    import pyarrow.parquet as pq

    return {row["instance_id"]: row for row in pq.read_table(path).to_pylist()}


def official_venv(venv: Path) -> str:
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "swebench==4.1.0"], check=True)
    return str(python)


def compare_with_official(python: str, envs_rows: Path, grades: dict, out: Path) -> dict[str, dict]:
    """Per instance and patch: tests on which the official report and ours agree, of how many, and `resolved`."""
    import pyarrow.parquet as pq

    metadata = {row["instance_id"]: row["extra_info"]["tools_kwargs"]["reward"]["metadata"]
                for row in pq.read_table(envs_rows).to_pylist()}
    items, ours = [], {}
    for patch, results in grades.items():
        for instance_id, row in results.items():
            verification = json.loads(row["verification"] or "{}")
            if not verification.get("log_file"):
                continue
            instance = {k: v for k, v in metadata[instance_id].items() if v is not None}
            key = f"{instance_id}/{patch}"
            items.append({"key": key, "instance": instance, "log": str(out / patch / verification["log_file"]),
                          "patch": instance["patch"] if patch == "gold" else ""})
            ours[key] = (verification.get("report") or {}).get(instance_id) or {}
    (out / "official-input.json").write_text(json.dumps(items))
    subprocess.run([python, "-c", OFFICIAL_CHECK, str(out / "official-input.json"), str(out / "official.json")],
                   check=True)
    official = json.loads((out / "official.json").read_text())
    agreement = {}
    for key, theirs in official.items():
        mine = ours[key]
        tests = agreed = 0
        for kind in ("FAIL_TO_PASS", "PASS_TO_PASS"):
            official_status = (theirs.get("tests_status") or {}).get(kind) or {}
            our_status = (mine.get("tests_status") or {}).get(kind) or {}
            official_passed, our_passed = set(official_status.get("success", [])), set(our_status.get("success", []))
            for name in official_passed | set(official_status.get("failure", [])) | our_passed | set(
                    our_status.get("failure", [])):
                tests += 1
                agreed += (name in official_passed) == (name in our_passed)
        agreement[key] = {"tests": tests, "agreed": agreed,
                          "resolved_agrees": bool(theirs.get("resolved")) == bool(mine.get("resolved"))}
    return agreement


def report(envs_rows: Path, grades: dict, agreement: dict, build_s: float) -> int:
    import pyarrow.parquet as pq

    rows = pq.read_table(envs_rows).to_pylist()
    header = ("instance", "repo", "version", "env build s", "env MB", "repo s", "repo MB", "grade s",
              "gold", "empty", "parser agrees")
    print("\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    failures = 0
    seen_envs: set[str] = set()
    for row in sorted(rows, key=lambda r: r["instance_id"]):
        instance_id = row["instance_id"]
        meta = row["extra_info"]["tools_kwargs"]["reward"]["metadata"]
        deployment = row["extra_info"]["tools_kwargs"]["env"]["deployment"]
        env_dir = Path((deployment.get("mounts") or {}).get("/opt/miniconda3", "")).parent
        env = json.loads((env_dir / "env.json").read_text()) if (env_dir / "env.json").is_file() else {}
        repo_json = Path(deployment["repo"] + ".json")
        repo = json.loads(repo_json.read_text()) if repo_json.is_file() else {}
        first = str(env_dir) not in seen_envs  # an environment shared by rows is counted once
        seen_envs.add(str(env_dir))
        gold, empty = grades["gold"].get(instance_id, {}), grades["empty"].get(instance_id, {})
        checks = [agreement.get(f"{instance_id}/{p}") for p in ("gold", "empty")]
        agreed = sum(c["agreed"] for c in checks if c)
        tests = sum(c["tests"] for c in checks if c)
        agrees = all(c and c["resolved_agrees"] and c["agreed"] == c["tests"] for c in checks)
        failures += (gold.get("status") != "resolved") + (empty.get("status") == "resolved") + (not agrees)
        print("| " + " | ".join([
            instance_id, meta["repo"], meta["version"],
            f"{env.get('seconds', 0):.0f}" if first else "(shared)",
            f"{env.get('disk_bytes', 0) / MB:.0f}" if first else "(shared)",
            f"{repo.get('seconds', 0):.0f}", f"{repo.get('disk_bytes', 0) / MB:.0f}",
            f"{float(gold.get('verify_s') or 0):.0f}", str(gold.get("status")), str(empty.get("status")),
            f"{agreed}/{tests} tests, resolved {'agrees' if agrees else 'DIFFERS'}"]) + " |")
    print(f"\nenvs build (all environments and repositories, --jobs): {build_s:.0f} s; "
          f"{'every check passed' if not failures else f'{failures} checks FAILED'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
