#!/usr/bin/env bash
# Submits a uni-agent Dask cluster to SLURM: the scheduler, then a GPU worker group and a sandbox (CPU) worker group
# that start once the scheduler job runs. Each job is first checked against its partition (nothing is submitted when
# one can never start there, and the reason is printed); after submitting, it waits up to --wait seconds for the jobs
# to run and warns about a job that is pending for a reason that will not resolve by waiting (PartitionConfig,
# ReqNodeNotAvail, ...). Prints the scheduler file, the tunnel to the dashboard and the command that ends it all.
#
#   UNI_AGENT_SHARED=~/uni-agent bash cluster/submit.sh [--gpu-nodes N] [--sandbox-nodes M] [sizes] [--wait S]
#
# Sizes (defaults fit a small node):   --scheduler-cpus 1  --scheduler-mem 4G
#   --gpu-nodes 1       --gpus-per-node 1   --gpu-cpus 8       --gpu-mem 32G
#   --sandbox-nodes 1   --sandbox-cpus 4    --sandbox-mem 8G   --time 24:00:00 (every job)
# --gpu-nodes 0 submits no GPU group: a CPU-only cluster (the llama.cpp engine then runs on a sandbox worker), or
# --engine external, or parallel_verify.py. --no-check skips the partition check; --wait 0 does not wait.
#
# Any sbatch option can be added per group, after the sizes (so it wins): UNI_AGENT_SCHEDULER_SBATCH,
# UNI_AGENT_GPU_SBATCH, UNI_AGENT_SANDBOX_SBATCH (e.g. UNI_AGENT_GPU_SBATCH="--partition gpu --account proj").
#
# The cluster speaks TLS: the credentials in UNI_AGENT_TLS_DIR (default ~/.config/uni-agent/tls, which must be on a
# disk every node reads) are written here when missing, and every process of the cluster and the driver present them;
# nobody else can connect (docs/security.md). Files it and the jobs write are the user's alone (umask 077).
set -euo pipefail
umask 077
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
gpu_nodes=1; gpus_per_node=1; gpu_cpus=8; gpu_mem=32G
sandbox_nodes=1; sandbox_cpus=4; sandbox_mem=8G
scheduler_cpus=1; scheduler_mem=4G
time_limit=24:00:00; check=1; wait_s=60
while [ $# -gt 0 ]; do
  case "$1" in
    --gpu-nodes) gpu_nodes="$2"; shift 2 ;;
    --gpus-per-node) gpus_per_node="$2"; shift 2 ;;
    --gpu-cpus) gpu_cpus="$2"; shift 2 ;;
    --gpu-mem) gpu_mem="$2"; shift 2 ;;
    --sandbox-nodes) sandbox_nodes="$2"; shift 2 ;;
    --sandbox-cpus) sandbox_cpus="$2"; shift 2 ;;
    --sandbox-mem) sandbox_mem="$2"; shift 2 ;;
    --scheduler-cpus) scheduler_cpus="$2"; shift 2 ;;
    --scheduler-mem) scheduler_mem="$2"; shift 2 ;;
    --time) time_limit="$2"; shift 2 ;;
    --wait) wait_s="$2"; shift 2 ;;
    --no-check) check=0; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument $1 (--help lists them)" >&2; exit 2 ;;
  esac
done
: "${UNI_AGENT_SHARED:?set UNI_AGENT_SHARED to a directory on shared disk (your home usually is)}"
export UNI_AGENT_VENV="${UNI_AGENT_VENV:-$repo/.venv}"
export UNI_AGENT_TLS_DIR="${UNI_AGENT_TLS_DIR:-$HOME/.config/uni-agent/tls}"
py="$UNI_AGENT_VENV/bin/python"
[ -x "$py" ] || { echo "no $py: run \`bash examples/setup.sh\` in $repo first (or set UNI_AGENT_VENV)" >&2; exit 2; }

# Each group's sbatch options: the sizes, then the user's own (later options win in sbatch, and in the check).
# shellcheck disable=SC2206  # the *_SBATCH variables are lists of options
scheduler_opts=(--cpus-per-task "$scheduler_cpus" --mem "$scheduler_mem" --time "$time_limit"
                ${UNI_AGENT_SCHEDULER_SBATCH:-})
# shellcheck disable=SC2206
gpu_opts=(--nodes "$gpu_nodes" --gres "gpu:$gpus_per_node" --cpus-per-task "$gpu_cpus" --mem "$gpu_mem"
          --time "$time_limit" ${UNI_AGENT_GPU_SBATCH:-})
# shellcheck disable=SC2206
sandbox_opts=(--nodes "$sandbox_nodes" --cpus-per-task "$sandbox_cpus" --mem "$sandbox_mem" --time "$time_limit"
              ${UNI_AGENT_SANDBOX_SBATCH:-})

if [ "$check" = 1 ]; then
  fits() { "$py" "$here/slurm_check.py" fits "$@"; }
  ok=1
  fits "the scheduler job" --script "$here/scheduler.sbatch" --flag cpus=--scheduler-cpus \
    --flag mem=--scheduler-mem -- "${scheduler_opts[@]}" || ok=0
  if [ "$gpu_nodes" -gt 0 ]; then
    fits "the GPU job" --script "$here/gpu-workers.sbatch" --flag cpus=--gpu-cpus --flag mem=--gpu-mem \
      --flag gpus=--gpus-per-node --flag nodes=--gpu-nodes -- "${gpu_opts[@]}" || ok=0
  fi
  if [ "$sandbox_nodes" -gt 0 ]; then
    fits "the sandbox job" --script "$here/sandbox-workers.sbatch" --flag cpus=--sandbox-cpus \
      --flag mem=--sandbox-mem --flag nodes=--sandbox-nodes -- "${sandbox_opts[@]}" || ok=0
  fi
  [ "$ok" = 1 ] || { echo "nothing submitted (sizes: --help; --no-check submits anyway)" >&2; exit 2; }
fi

mkdir -p "$UNI_AGENT_SHARED/logs"
"$py" -m uni_agent.driver.tls init "$UNI_AGENT_TLS_DIR"
out=(--output "$UNI_AGENT_SHARED/logs/%x-%j.out")
scheduler=$(sbatch --parsable "${out[@]}" "${scheduler_opts[@]}" "$here/scheduler.sbatch" | cut -d';' -f1)
export UNI_AGENT_SCHEDULER_FILE="${UNI_AGENT_SCHEDULER_FILE:-$UNI_AGENT_SHARED/scheduler-$scheduler.json}"
jobs=("$scheduler"); groups="scheduler"
# A worker group whose sbatch fails leaves the jobs submitted before it: cancel them, then stop.
submit_group() {
  local id
  id=$(sbatch --parsable "${out[@]}" --dependency "after:$scheduler" "$@" | cut -d';' -f1) \
    || { scancel "${jobs[@]}"; echo "sbatch refused the job; cancelled ${jobs[*]}" >&2; exit 2; }
  jobs+=("$id")
}
if [ "$gpu_nodes" -gt 0 ]; then submit_group "${gpu_opts[@]}" "$here/gpu-workers.sbatch"; groups+=", GPU workers"; fi
if [ "$sandbox_nodes" -gt 0 ]; then
  submit_group "${sandbox_opts[@]}" "$here/sandbox-workers.sbatch"; groups+=", sandbox workers"
fi
echo "${jobs[*]}" > "$UNI_AGENT_SHARED/jobs-$scheduler.txt"
# The latest cluster, for `source`: what the driver needs to find it and connect, and its jobs for scancel (a
# shell variable, not exported: the driver refuses UNI_AGENT_* variables that are not its settings).
printf 'export UNI_AGENT_SCHEDULER_FILE=%q UNI_AGENT_TLS_DIR=%q\nuni_agent_jobs=%q\n' \
  "$UNI_AGENT_SCHEDULER_FILE" "$UNI_AGENT_TLS_DIR" "${jobs[*]}" > "$UNI_AGENT_SHARED/cluster.env"
if [ "$UNI_AGENT_VENV" = "$repo/.venv" ] && [ "$PWD" = "$repo" ]; then run=".venv/bin/python examples"
else run="$UNI_AGENT_VENV/bin/python $repo/examples"; fi
cat <<MSG
jobs: ${jobs[*]} ($groups); logs in $UNI_AGENT_SHARED/logs
scheduler file: $UNI_AGENT_SCHEDULER_FILE
run:   source $UNI_AGENT_SHARED/cluster.env   # UNI_AGENT_SCHEDULER_FILE, UNI_AGENT_TLS_DIR; \$uni_agent_jobs
       $run/agent_interaction/parallel_infer.py --output-dir $UNI_AGENT_SHARED/runs/run1 ...
stop:  scancel ${jobs[*]}     (after the source: scancel \$uni_agent_jobs)
MSG
[ "$wait_s" = 0 ] && exit 0
exec "$py" "$here/slurm_check.py" watch --seconds "$wait_s" --scheduler-job "$scheduler" \
  --scheduler-file "$UNI_AGENT_SCHEDULER_FILE" "${jobs[@]}"
