"""Before/after of the shared first-wave prompt on llama-server (uni_agent.engines.shared_prompt), in one invocation:

    python -m uni_agent.bench.shared_prompt --output-dir /tmp/share -- --max-samples 4 --n 2 --max-turns 2 \
        --max-tokens 64 --temperature 0 --no-verify

runs examples/agent_interaction/parallel_infer.py (the quickstart's run) with engine_share_prompt off, then on, and
prints from each engine log the tokens the first wave read and the time from its first request reaching the server to
its last prompt read, with the run's wall time and the machine's load average.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

PARALLEL_INFER = Path(__file__).resolve().parents[2] / "examples" / "agent_interaction" / "parallel_infer.py"
SELECTED = re.compile(r"(\S+) I slot get_availabl: id +(\d+) \| task -1 \| selected slot by (\w+)")
PROMPT_READ = re.compile(r"(\S+) I slot print_timing: id +(\d+) \| task (\d+) \| prompt eval time = +([\d.]+) ms / +(\d+) "
                         r"tokens")


def _seconds(stamp: str) -> float:
    """llama-server's log time, minutes.seconds.milliseconds.microseconds since its start."""
    minutes, seconds, millis, _ = stamp.split(".")
    return int(minutes) * 60 + int(seconds) + int(millis) / 1e3


def first_wave(log: str, shared: bool) -> dict[str, float]:
    """The first wave on one server: each slot's first prompt read after the warm-up (task 0 when shared)."""
    chosen = [(_seconds(m[1]), m[3]) for m in SELECTED.finditer(log)]
    reads = [(_seconds(m[1]), int(m[2]), int(m[3]), float(m[4]), int(m[5])) for m in PROMPT_READ.finditer(log)]
    warm = [r for r in reads if shared and r[2] == 0]
    first: dict[int, tuple] = {}
    for read in reads:
        if read not in warm:
            first.setdefault(read[1], read)
    wave = list(first.values())
    arrivals = [t for t, how in chosen if how != "id"][:len(wave)]  # "by id": the warm-up's own request
    return {"warmup_tokens": sum(r[4] for r in warm), "warmup_s": sum(r[3] for r in warm) / 1e3,
            "slots": len(wave), "wave_tokens": sum(r[4] for r in wave),
            "wave_s": max(r[0] for r in wave) - min(arrivals), "arrivals_over_s": max(arrivals) - min(arrivals),
            "all_tokens": sum(r[4] for r in reads)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", required=True, help="each run goes to OUTPUT_DIR/share-off, share-on")
    parser.add_argument("run_args", nargs="*", help="parallel_infer.py arguments (after --)")
    args = parser.parse_args(argv)
    for shared in (False, True):
        out = Path(args.output_dir) / f"share-{'on' if shared else 'off'}"
        shutil.rmtree(out, ignore_errors=True)
        load = os.getloadavg()[0]
        env = {**os.environ, "UNI_AGENT_ENGINE_SHARE_PROMPT": str(shared).lower()}
        done = subprocess.run([sys.executable, str(PARALLEL_INFER), *args.run_args, "--no-progress", "--output-dir",
                               str(out)], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{out}: parallel_infer.py exited {done.returncode}:\n{done.stderr[-3000:]}", file=sys.stderr)
            return 1
        wall = json.loads((out / "summary.json").read_text())["wall_seconds"]
        wave = first_wave((out / "logs" / "engine-0.log").read_text(), shared)
        print(f"share_prompt {'on ' if shared else 'off'} (load {load:.1f} -> {os.getloadavg()[0]:.1f}): run wall "
              f"{wall} s; warm-up {wave['warmup_tokens']} tokens in {wave['warmup_s']:.1f} s; first wave "
              f"({wave['slots']} slots) read {wave['wave_tokens']} tokens, {wave['wave_s']:.1f} s from its first "
              f"request to its last prompt read (arrivals over {wave['arrivals_over_s']:.1f} s); all calls read "
              f"{wave['all_tokens']} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
