#!/usr/bin/env bash
# Submits a uni-agent Dask cluster to SLURM: the scheduler, then a GPU worker group and a sandbox (CPU) worker group
# that start once the scheduler job runs. Prints the scheduler file for the driver and the command that ends it all.
#
#   UNI_AGENT_SHARED=/shared/ua bash cluster/submit.sh [--gpu-nodes N] [--sandbox-nodes M]
#
# Any sbatch option can be added per group: UNI_AGENT_SCHEDULER_SBATCH, UNI_AGENT_GPU_SBATCH, UNI_AGENT_SANDBOX_SBATCH
# (e.g. UNI_AGENT_GPU_SBATCH="--partition gpu --account proj --gres=gpu:4"). --gpu-nodes 0 submits no GPU group
# (for --engine external, or for parallel_verify.py).
#
# The cluster speaks TLS: the credentials in UNI_AGENT_TLS_DIR (default ~/.config/uni-agent/tls, which must be on a
# disk every node reads) are written here when missing, and every process of the cluster and the driver present them;
# nobody else can connect (docs/security.md).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
gpu_nodes=1; sandbox_nodes=1
while [ $# -gt 0 ]; do
  case "$1" in
    --gpu-nodes) gpu_nodes="$2"; shift 2 ;;
    --sandbox-nodes) sandbox_nodes="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
: "${UNI_AGENT_SHARED:?set UNI_AGENT_SHARED to a directory on shared disk}"
export UNI_AGENT_VENV="${UNI_AGENT_VENV:-$(dirname "$here")/.venv}"
export UNI_AGENT_TLS_DIR="${UNI_AGENT_TLS_DIR:-$HOME/.config/uni-agent/tls}"
mkdir -p "$UNI_AGENT_SHARED/logs"
"$UNI_AGENT_VENV/bin/python" -m uni_agent.driver.tls init "$UNI_AGENT_TLS_DIR"
out=(--output "$UNI_AGENT_SHARED/logs/%x-%j.out")

# shellcheck disable=SC2086  # the *_SBATCH variables are lists of options
scheduler=$(sbatch --parsable "${out[@]}" ${UNI_AGENT_SCHEDULER_SBATCH:-} "$here/scheduler.sbatch" | cut -d';' -f1)
export UNI_AGENT_SCHEDULER_FILE="${UNI_AGENT_SCHEDULER_FILE:-$UNI_AGENT_SHARED/scheduler-$scheduler.json}"
jobs=("$scheduler")
if [ "$gpu_nodes" -gt 0 ]; then
  # shellcheck disable=SC2086
  jobs+=("$(sbatch --parsable "${out[@]}" --dependency "after:$scheduler" --nodes "$gpu_nodes" \
    ${UNI_AGENT_GPU_SBATCH:-} "$here/gpu-workers.sbatch" | cut -d';' -f1)")
fi
if [ "$sandbox_nodes" -gt 0 ]; then
  # shellcheck disable=SC2086
  jobs+=("$(sbatch --parsable "${out[@]}" --dependency "after:$scheduler" --nodes "$sandbox_nodes" \
    ${UNI_AGENT_SANDBOX_SBATCH:-} "$here/sandbox-workers.sbatch" | cut -d';' -f1)")
fi
echo "${jobs[*]}" > "$UNI_AGENT_SHARED/jobs-$scheduler.txt"
cat <<MSG
jobs: ${jobs[*]} (scheduler, then the worker groups); logs in $UNI_AGENT_SHARED/logs
scheduler file: $UNI_AGENT_SCHEDULER_FILE
run:   export UNI_AGENT_SCHEDULER_FILE=$UNI_AGENT_SCHEDULER_FILE UNI_AGENT_TLS_DIR=$UNI_AGENT_TLS_DIR
       python examples/agent_interaction/parallel_infer.py --scheduler-file \$UNI_AGENT_SCHEDULER_FILE ...
stop:  scancel ${jobs[*]}
MSG
