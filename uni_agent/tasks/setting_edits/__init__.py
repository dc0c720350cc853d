"""A family of small tasks for reinforcement learning with a tiny model: change one setting in a one-file repository.

Each task is a repository with `settings.py` (a handful of `NAME = value` lines) and the issue "In settings.py, change
`RETRIES = 3` to `RETRIES = 5`". Hidden tests check the new value, and existing tests check that the other settings
are untouched, so a model that rewrites the file or edits the wrong line gets 0. The edit is one
`str_replace_editor` call (or one `sed`) with the strings the issue quotes: SmolLM2-135M-Instruct gets it right
sometimes, which is what a policy-gradient loop needs to learn from.

The tasks are written in the bundled tasks' SWE-bench form (instance.json + repo/, uni_agent.tasks.swe_form) and
turned into dataset rows by the same `convert`; `write_tasks(folder, split="train" | "heldout")` makes them from a
seed, so training and held-out tasks are of one family but share no setting name.
"""

from .generate import HELDOUT_NAMES, LEVELS, TRAIN_NAMES, task_rows, write_tasks

__all__ = ["HELDOUT_NAMES", "LEVELS", "TRAIN_NAMES", "task_rows", "write_tasks"]
