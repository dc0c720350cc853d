#!/bin/bash
# RL on the GPU machine, call 2 of 2: carry [".devstash/rl/c2"], right after call 1 (whose /root/stash it uses).
# Puts SmolLM2's GGUF back together, then trains: GRPO on the setting-edit tasks, synchronous steps then
# asynchronous ones, held-out reward before and after, within TRAIN_BUDGET seconds. Its figures land in $OUT.
set -x
S=/root/stash C=.devstash/rl/c2
source $S/env.sh || { echo "no $S/env.sh: call 1 did not run on this machine"; exit 1; }
cat $S/smol.gguf.xz.aa $C/smol.gguf.xz.ab | xz -dc -T0 > $S/smol.gguf
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $S/smol.gguf" | sha256sum -c || exit 1
mkdir -p $OUT/run
cd $S/tree && timeout $((${TRAIN_BUDGET:-480} + 60)) python3 examples/rl/train.py --gpu --model $S/smol.gguf \
  --steps 60 --time-budget ${TRAIN_BUDGET:-480} --train-tasks 16 --heldout-tasks 12 --n 8 --eval-n 8 \
  --async-from ${ASYNC_FROM:-5} --max-staleness 1 --lr ${LR:-5e-5} --servers 4 --sandbox-workers 4 --sandbox-threads 3 \
  --sdist $S/llama_cpp_python-0.3.36.tar.gz ${TEST_CMD:+--test-cmd "$TEST_CMD"} --out $S/run 2>&1 \
  | grep -v "Writing model shards" | tee $OUT/run/train.txt
cp $S/run/metrics.jsonl $S/run/summary.json $S/run/service/service.json $OUT/run/ 2>/dev/null
python3 - <<'EOF' > $OUT/run/rows.txt 2>&1
# Every row's versions, for the consistency check in the report (the Parquet rows themselves stay there: large).
import pandas as pd
df = pd.read_parquet("/root/stash/run/service/results")
cols = ["instance_id", "rollout", "step", "policy_version", "version_min", "version_max", "staleness_action",
        "reward", "exit_reason", "num_turns", "completion_tokens"]
print(df[cols].sort_values(["step", "instance_id", "rollout"]).to_string())
EOF
tail -3 $OUT/run/rows.txt; nvidia-smi --query-gpu=memory.used --format=csv
