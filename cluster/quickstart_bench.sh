#!/usr/bin/env bash
# The README's first command as a new user meets it, timed, for each git REF given (default: HEAD), one after the
# other on this machine: a fresh clone in a temporary directory, a fresh .venv, an empty llama-server cache (so the
# build is part of the figure: UNI_AGENT_LLAMA_DIR points into the temporary directory), then
# `bash examples/quickstart.sh`. Not fresh: apt packages already installed and pip's download cache (~/.cache/pip).
# Prints, per REF: the whole command's wall time, the run's own wall time and rollouts/min (its summary.json), and
# the load average before and after.
#   bash cluster/quickstart_bench.sh 414c974 HEAD          # before and after, in one invocation
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
refs=("$@"); [ ${#refs[@]} -gt 0 ] || refs=(HEAD)
results=()
for ref in "${refs[@]}"; do
  work="$(mktemp -d /tmp/quickstart-bench.XXXXXX)"
  git clone -q "$repo" "$work/repo"
  git -C "$work/repo" checkout -q "$(git -C "$repo" rev-parse "$ref")"
  load_before="$(cut -d' ' -f1 /proc/loadavg)"
  echo "quickstart_bench: $ref in $work (load average $load_before), log $work/quickstart.log" >&2
  start=$(date +%s)
  status=0
  (cd "$work/repo" && UNI_AGENT_LLAMA_DIR="$work/llama" bash examples/quickstart.sh >"$work/quickstart.log" 2>&1) \
    || status=$?
  wall=$(( $(date +%s) - start ))
  load_after="$(cut -d' ' -f1 /proc/loadavg)"
  run="$(python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(f\"run {s['wall_seconds']:.0f} s, \
{s['num_rollouts']} rollouts, {s['rollouts_per_minute']} per minute, {s['errors']} errors\")" \
    "$work/repo/outputs/quickstart/summary.json" 2>/dev/null || echo "no summary.json")"
  results+=("$ref ($(git -C "$repo" rev-parse --short "$ref")): exit $status, whole command ${wall} s ($((wall / 60)) min \
$((wall % 60)) s); $run; load average $load_before before, $load_after after")
done
printf '%s\n' "${results[@]}"
