"""Terminal-Bench 2 tasks: task folders → dataset rows, task images, and the reward contract.

A task folder holds `task.toml` (timeouts, resources), `instruction.md` (the prompt), `environment/Dockerfile` (the
machine the agent works in), `tests/test.sh` (the verifier) and `solution/solve.sh` (the oracle). Modules:

- `task.py`: read and validate one folder (pydantic, errors naming the folder and the field);
- `dockerfile.py`: what the Dockerfile says about the workdir, and whether the host can stand in for the image;
- `images.py`: build a task's image with podman/docker from its Dockerfile;
- `preprocess.py`: folders → Parquet rows (tests and solution packed into the row, never shown to the agent);
- the reward contract (upload /tests, run test.sh, read /logs/verifier/reward.txt|json) and the oracle: the
  `terminal_bench` grader, uni_agent/grading/terminal_bench.py.

The bundled tasks (`tasks/`) are ours, written in the Terminal-Bench 2 format.
"""

from pathlib import Path

BUNDLED_TASKS_DIR = Path(__file__).resolve().parent / "tasks"
DATA_SOURCE = "terminal_bench_v2"
REWARD_NAME = "terminal_bench"
