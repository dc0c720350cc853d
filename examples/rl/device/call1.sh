#!/bin/bash
# RL on the GPU machine, call 1 of 2 (docs/online.md, "A real RL loop"): run from the repository root with
# carry [".devstash/rl/c1"]. Stashes what travelled outside the work tree, builds the CUDA llama-server (about 5
# minutes), installs the carried Python packages and, once the build is done, runs the whole loop on a random tiny
# model (2 steps, one of them asynchronous) so that call 2 only has to run the real one (SMOKE=0 skips that: about
# 90 s less). Everything lands in /root/stash, which call 2 (sent right after: the machine stays warm only
# briefly) reuses.
set -x
S=/root/stash C=.devstash/rl/c1
mkdir -p $S $OUT/smoke && cp $C/smol.gguf.xz.aa $C/llama_cpp_python-0.3.36.tar.gz $S/ || exit 1
export UNI_AGENT_LLAMA_DIR=$S/llama PYTHONUNBUFFERED=1
rm -rf $S/tree && mkdir -p $S/tree && tar xzf $C/tree.tar.gz -C $S/tree || exit 1
nproc; nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
( python3 $S/tree/uni_agent/engines/llama_build.py --variant cuda --sdist $S/llama_cpp_python-0.3.36.tar.gz \
    --jobs 14 > $S/build.log 2>&1; echo "build exit $?" >> $S/build.log ) &
BUILD=$!
tar xJf $C/site312.tar.xz -C $S && mkdir -p $S/tok && tar xJf $C/tokenizer.tar.xz -C $S/tok || exit 1
ENV="export PYTHONPATH=$S/tree:$S/site312 UNI_AGENT_LLAMA_DIR=$S/llama PYTHONUNBUFFERED=1"
if ! command -v bwrap; then
  mkdir -p $S/bw && dpkg -x $C/bubblewrap_*.deb $S/bw && ENV="$ENV PATH=$S/bw/usr/bin:\$PATH"
fi
# The graders run `python -m pytest` in the sandbox, whose PATH starts with this Python's prefix: say so if that
# python has no pytest, and give the tasks a test command that has one (pytest from the carried packages, under /usr, which
# a sandbox over the host sees).
TEST_CMD=""
if ! (cd /tmp && python -c "import pytest" 2>/dev/null); then
  mkdir -p /usr/local/lib/rl-pytest && cp -r $S/site312/{_pytest,pytest,pluggy,iniconfig,packaging,py.py} /usr/local/lib/rl-pytest/ 2>/dev/null
  TEST_CMD="PYTHONPATH=/usr/local/lib/rl-pytest python3 -m pytest -rA -p no:cacheprovider -q"
  (cd /tmp && PYTHONPATH=/usr/local/lib/rl-pytest python3 -m pytest --version) || echo "NO PYTEST FOR THE GRADERS"
fi
echo "$ENV" > $S/env.sh && echo "TEST_CMD='$TEST_CMD'" >> $S/env.sh && cat $S/env.sh
source $S/env.sh
python3 -c "
import sys, torch, transformers, dask, distributed, pydantic, uni_agent.online.service, uni_agent.training.trainer
print(sys.version, 'torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__)
" 2>&1 | tee $OUT/smoke/imports.txt
bwrap --version; git --version
wait $BUILD; tail -3 $S/build.log | tee $OUT/smoke/build.txt
ls -la $S/llama/*/bin/ 2>&1 | tee -a $OUT/smoke/build.txt
[ "${SMOKE:-1}" = 0 ] && { echo "BUILT, no smoke (SMOKE=0)"; exit 0; }
# The whole loop on a random 2-layer model: GPU servers, sandboxes, graders, a training step, the converter, the
# switch; step 0 synchronous, step 1 asynchronous (its batch runs while step 0 trains and the update lands).
cd $S/tree && timeout 240 python3 examples/rl/train.py --gpu --tiny --tokenizer $S/tok --steps 2 --n 4 \
  --train-tasks 4 --heldout-tasks 2 --eval-n 2 --servers 2 --async-from 0 --sdist $S/llama_cpp_python-0.3.36.tar.gz \
  ${TEST_CMD:+--test-cmd "$TEST_CMD"} --out $S/smoke 2>&1 | tail -40 | tee $OUT/smoke/train.txt
cp $S/smoke/metrics.jsonl $S/smoke/summary.json $OUT/smoke/ 2>/dev/null
tail -5 $S/smoke/cluster/processes/*.log > $OUT/smoke/processes-tail.txt 2>&1
grep -q "held-out reward" $OUT/smoke/train.txt && echo "SMOKE OK" || echo "SMOKE FAILED"
