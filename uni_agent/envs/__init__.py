"""Task environments for SWE-bench rows, built on this machine from the official specs (`uni-agent envs build`).

No container runtime and no images: a task's environment is an interpreter and packages. For every (repo, version)
of the rows, the environment swebench 4.1.0's spec describes (Python version, packages, pip_packages, pre_install,
install) is made from the repository at its environment_setup_commit, in a bubblewrap sandbox that sees it where the
official images keep it (/opt/miniconda3/envs/testbed, the repository at /testbed), so every path written into it
(scripts' first lines, the venv's config, the editable install's .pth) is right inside a task's sandbox. Each row's
repository is then checked out at base_commit with the spec's pre_install and install run over it (its own build
artifacts: egg-info, a setuptools_scm version file), and the row gets the mounts and `env_prebuilt: "1"`: at grade
time nothing is installed and nothing needs the network.

    plan.py          what to build, from the rows alone (unit-tested without network or repositories)
    interpreters.py  where a Python X.Y comes from: uv, pyenv, conda or PATH
    isolation.py     the bubblewrap command a build step runs in, and the `conda activate` stand-in
    index_access.py  the builder's way to the package index, carried into a build step (proxies, pip config)
    build.py         making an environment and a row's repository, cached per user; pruning the unused
    batch.py         many rows' environments in parallel, progress, the rows pointed at them
    command.py       the `uni-agent envs build` and `envs prune` commands
    first_use.py     `--build-envs`: a run's rows get their environments before it starts
"""
