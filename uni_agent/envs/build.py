"""Making an environment and a row's repository, cached per user under <cache>/swebench-envs/:

    envs/<repo>-<version>-<hash>/miniconda3/   mounted at /opt/miniconda3 (bin/activate, envs/testbed: the venv)
    envs/<...>/env.json                         what it was built from, how long it took, its size
    pythons/<name>/                             the interpreter, hard-linked (else copied) from where it was found,
                                                mounted at that path: a cache another user can be given read-only
    repos/<instance_id>-<hash>/                 the row's repository: base_commit, pre_install and install run over it
    git/<owner>+<name>.git                      bare clones, when no mirror directory is given (needs the network)

Everything is built in a temp dir and renamed into place, so an interrupted build is made again and a finished one
is never half there. Build logs stay next to what they built (build.log, prepare.log). Each `envs build` that finds
an environment or a repository here marks it used (its record's mtime); `prune_unused` removes what no build asked
for lately.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..config import ConfigError
from ..sandbox.userns import remove_tree
from .interpreters import Interpreter, find_python
from .isolation import StepDirs, step_argv, write_shim
from .plan import CONDA_ROOT, ENV_PREFIX, EnvPlan, InstancePlan, requirements_text

CACHE_SUBDIR = "swebench-envs"
LOG_TAIL_CHARS = 3000
GIT_ENV = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_TERMINAL_PROMPT": "0"}
TAGS_PER_FETCH = 500


class BuildError(RuntimeError):
    """A build step failed; the message names the step, its log and the log's tail."""


@dataclass
class Built:
    """An environment or a repository, ready: where, what it mounts, what it cost."""

    name: str
    path: str
    seconds: float
    disk_bytes: int
    cached: bool
    mounts: dict[str, str]


def envs_root() -> Path:
    from ..private_dirs import private_cache_dir

    return private_cache_dir() / CACHE_SUBDIR


class GitSource:
    """Commits of a repository: from a mirror directory (<dir>/<owner>+<name>/repo, <dir>/<owner>+<name>, or
    <dir>/<owner>__<name>, bare or not), else from a bare clone of GitHub's kept in the cache."""

    def __init__(self, root: Path, mirror_dir: Path | None = None):
        self.root, self.mirror_dir = root, mirror_dir

    def git_dir(self, repo: str) -> Path:
        owner, name = repo.split("/")
        if self.mirror_dir is not None:
            for candidate in (f"{owner}+{name}/repo", f"{owner}+{name}", f"{owner}__{name}"):
                path = self.mirror_dir / candidate
                if (path / "objects").is_dir() or (path / ".git").exists():
                    return path
            raise ConfigError(f"no mirror of {repo} under {self.mirror_dir} (looked for {owner}+{name}/repo, "
                              f"{owner}+{name}, {owner}__{name})")
        clone = self.root / "git" / f"{owner}+{name}.git"
        if not clone.is_dir():
            clone.parent.mkdir(parents=True, exist_ok=True)
            partial = Path(tempfile.mkdtemp(prefix=f".{clone.name}-", dir=clone.parent))
            _git(["clone", "--bare", "--quiet", f"https://github.com/{repo}", str(partial)], f"cloning {repo}")
            os.rename(partial, clone)
        return clone

    def checkout(self, repo: str, commit: str, dest: Path) -> None:
        """`dest`: a new repository holding `commit` and its history only (nothing newer), HEAD detached there."""
        source = self.git_dir(repo)
        _git(["init", "--quiet", str(dest)], f"git init {dest}")
        if self.mirror_dir is None and not _has_commit(source, commit):
            _git(["--git-dir", str(source), "fetch", "--quiet", "origin", "+refs/heads/*:refs/heads/*"],
                 f"updating the clone of {repo}")
        _git(["-C", str(dest), "fetch", "--quiet", str(source), commit], f"fetching {repo}@{commit[:12]}")
        _git(["-C", str(dest), "checkout", "--quiet", "--detach", "FETCH_HEAD"], f"checking out {commit[:12]}")
        # The tags of its history, none newer (as the official images keep them): setuptools_scm and friends make
        # the package's version from them (without, pytest calls itself 0.1.dev and refuses its own minversion).
        tags = subprocess.run(["git", "--git-dir", str(source), "tag", "--merged", commit], capture_output=True,
                              text=True, env={**os.environ, **GIT_ENV}).stdout.split()
        for start in range(0, len(tags), TAGS_PER_FETCH):
            refspecs = [f"refs/tags/{tag}:refs/tags/{tag}" for tag in tags[start:start + TAGS_PER_FETCH]]
            _git(["-C", str(dest), "fetch", "--quiet", "--no-tags", str(source), *refspecs], f"fetching {repo}'s tags")

    def read(self, repo: str, commit: str, path: str) -> str | None:
        done = subprocess.run(["git", "--git-dir", str(self.git_dir(repo)), "show", f"{commit}:{path}"],
                              capture_output=True, text=True, env={**os.environ, **GIT_ENV})
        return done.stdout if done.returncode == 0 else None


def _has_commit(git_dir: Path, commit: str) -> bool:
    return subprocess.run(["git", "--git-dir", str(git_dir), "cat-file", "-e", f"{commit}^{{commit}}"],
                          capture_output=True, env={**os.environ, **GIT_ENV}).returncode == 0


def _git(args: list[str], what: str) -> None:
    done = subprocess.run(["git", *args], capture_output=True, text=True, env={**os.environ, **GIT_ENV})
    if done.returncode != 0:
        raise BuildError(f"{what} failed: {done.stderr.strip()[-LOG_TAIL_CHARS:]}")


def interpreter_copy(root: Path, interpreter: Interpreter) -> str:
    """The host directory mounted at the interpreter's prefix: a hard-linked copy in the cache (a plain copy across
    file systems), so the environment does not depend on the original staying, and can be shared read-only."""
    if not interpreter.needs_mount:
        return interpreter.prefix
    digest = hashlib.sha256(interpreter.prefix.encode()).hexdigest()[:8]
    copy = root / "pythons" / f"{Path(interpreter.prefix).name}-{digest}"
    if copy.is_dir():
        return str(copy)
    copy.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{copy.name}-", dir=copy.parent))
    done = subprocess.run(["cp", "-al", f"{interpreter.prefix}/.", str(partial)], capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(partial)
        partial.mkdir()
        shutil.copytree(interpreter.prefix, partial, symlinks=True, dirs_exist_ok=True)
    try:
        os.rename(partial, copy)
    except OSError:  # another build made it meanwhile
        shutil.rmtree(partial, ignore_errors=True)
    return str(copy)


def make_prefix(interpreter: Interpreter, interpreter_dir: str, prefix: Path) -> None:
    """The environment as conda makes one: a whole Python installation of its own at ENV_PREFIX, not a venv (a venv
    is lost through a symlink to its python, which tox-current-env makes: sphinx's tests then ran without pytest).
    Hard links to the interpreter's files, except site-packages, which starts empty as a fresh conda environment's
    does (the build script bootstraps pip with ensurepip; what was installed into the interpreter stays out), and
    the scripts in bin/ that name the interpreter's python (rewritten, as new files, to name the environment's)."""
    done = subprocess.run(["cp", "-al", f"{interpreter_dir}/.", str(prefix)], capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(prefix, ignore_errors=True)
        shutil.copytree(interpreter_dir, prefix, symlinks=True)
    minor = ".".join(interpreter.version.split(".")[:2])
    site = prefix / "lib" / f"python{minor}" / "site-packages"
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    old_shebang = f"#!{interpreter.prefix}/bin/".encode()
    for script in (prefix / "bin").iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        with script.open("rb") as handle:
            if handle.read(len(old_shebang)) != old_shebang:
                continue
        text = script.read_bytes().replace(old_shebang, f"#!{ENV_PREFIX}/bin/".encode(), 1)
        fresh = script.with_name(f".{script.name}.new")
        fresh.write_bytes(text)
        fresh.chmod(script.stat().st_mode)
        os.replace(fresh, script)  # a new inode: the interpreter's own file stays as it was


def disk_usage(path: Path, shared_with: str | None = None) -> int:
    """Bytes of the files under `path`, each inode counted once, leaving out those hard-linked from `shared_with`
    (the interpreter, counted apart)."""
    seen, total = set(), 0
    if shared_with:
        for folder, _, files in os.walk(shared_with):
            seen.update((info.st_dev, info.st_ino) for info in (os.lstat(os.path.join(folder, f)) for f in files))
    for folder, _, files in os.walk(path):
        for name in files:
            info = os.lstat(os.path.join(folder, name))
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_blocks * 512
    return total


def run_step(argv: list[str], log: Path, what: str) -> None:
    with log.open("w") as out:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-LOG_TAIL_CHARS:]
        raise BuildError(f"{what} failed (exit {done.returncode}); whole log: {log}\n{tail}")


def build_env(plan: EnvPlan, source: GitSource, root: Path | None = None) -> Built:
    """The environment of `plan`, from the cache or made now."""
    root = root or envs_root()
    final = root / "envs" / plan.key
    record = final / "env.json"
    if record.is_file():
        os.utime(record)  # last used: what `uni-agent envs prune` goes by
        info = json.loads(record.read_text())
        return Built(plan.label, str(final), info["seconds"], info["disk_bytes"], True, info["mounts"])
    started = time.monotonic()
    interpreter = find_python(plan.python)
    interpreter_dir = interpreter_copy(root, interpreter)
    final.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{plan.key}-", dir=final.parent))
    try:
        write_shim(building / "miniconda3")
        make_prefix(interpreter, interpreter_dir, building / "miniconda3" / ENV_PREFIX.removeprefix(CONDA_ROOT + "/"))
        scratch = building / "scratch"
        source.checkout(plan.repo, plan.setup_commit, scratch / "repo")
        requirements = None
        if plan.packages == "requirements.txt":
            requirements = requirements_text(lambda path: source.read(plan.repo, plan.setup_commit, path),
                                             plan.requirements_paths)
        script = plan.build_script(requirements)
        (building / "build.sh").write_text(script)
        argv = step_argv(StepDirs(scratch / "repo", building / "miniconda3", scratch, root / "pip-cache"),
                         interpreter, interpreter_dir, script, throwaway_env=False, constraints=plan.constraints)
        run_step(argv, building / "build.log", f"building the environment of {plan.label}")
        remove_tree(scratch)
        mounts = {CONDA_ROOT: str(final / "miniconda3")}
        if interpreter.needs_mount:
            mounts[interpreter.prefix] = interpreter_dir
        seconds = time.monotonic() - started
        record_of = {"plan": asdict(plan), "interpreter": asdict(interpreter), "seconds": round(seconds, 1),
                     "disk_bytes": disk_usage(building / "miniconda3", interpreter_dir), "mounts": mounts}
        (building / "env.json").write_text(json.dumps(record_of, indent=1))
        os.rename(building, final)
    except BaseException:
        remove_tree(building)
        raise
    return Built(plan.label, str(final), seconds, record_of["disk_bytes"], False, mounts)


def prepare_repo(instance: InstancePlan, env: Built, source: GitSource, root: Path | None = None) -> Built:
    """The row's repository at base_commit with the spec's pre_install and install run over it, in a build sandbox
    where the environment is a throwaway overlay (what install writes into it is not kept; what it writes into the
    repository, egg-info or a version file, is)."""
    root = root or envs_root()
    digest = hashlib.sha256(f"{instance.base_commit}:{instance.env.key}".encode()).hexdigest()[:10]
    final = root / "repos" / f"{instance.instance_id}-{digest}"
    record = final.with_name(final.name + ".json")
    if record.is_file() and final.is_dir():
        os.utime(record)  # last used: what `uni-agent envs prune` goes by
        info = json.loads(record.read_text())
        return Built(instance.instance_id, str(final), info["seconds"], info["disk_bytes"], True, env.mounts)
    started = time.monotonic()
    final.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        source.checkout(instance.repo, instance.base_commit, building / "repo")
        interpreter = Interpreter(**json.loads((Path(env.path) / "env.json").read_text())["interpreter"])
        interpreter_dir = env.mounts.get(interpreter.prefix, interpreter.prefix)
        dirs = StepDirs(building / "repo", Path(env.path) / "miniconda3", building / "scratch", root / "pip-cache")
        argv = step_argv(dirs, interpreter, interpreter_dir, instance.prepare_script(), throwaway_env=True,
                         constraints=instance.env.constraints)
        run_step(argv, building / "prepare.log", f"preparing the repository of {instance.instance_id}")
        remove_tree(building / "scratch")
        shutil.rmtree(final, ignore_errors=True)
        os.rename(building / "repo", final)
        seconds = time.monotonic() - started
        info = {"seconds": round(seconds, 1), "disk_bytes": disk_usage(final), "env": env.path}
        shutil.move(str(building / "prepare.log"), str(final.with_name(final.name + ".prepare.log")))
        record.write_text(json.dumps(info))
    finally:
        remove_tree(building)
    return Built(instance.instance_id, str(final), seconds, info["disk_bytes"], False, env.mounts)


@dataclass
class Pruned:
    envs: int = 0
    repos: int = 0
    bytes: int = 0


def prune_unused(older_than_days: float, root: Path | None = None) -> Pruned:
    """Remove the repositories and environments no `envs build` asked for in `older_than_days` (0: all), half-built
    ones a day old, and the interpreters no environment left uses. An environment a kept repository was prepared
    with is kept. Rows that name what was removed need `envs build` again before they are graded."""
    root = root or envs_root()
    pruned = Pruned()
    now, horizon = time.time(), older_than_days * 86400.0

    def stale(record: Path, building: bool) -> bool:
        return now - record.stat().st_mtime >= (86400.0 if building else horizon)

    def remove(path: Path) -> None:
        pruned.bytes += disk_usage(path) if path.is_dir() else path.stat().st_size
        remove_tree(path) if path.is_dir() else path.unlink()

    kept_envs: set[str] = set()
    repos = root / "repos"
    for repo in sorted(repos.iterdir()) if repos.is_dir() else []:
        if repo.name.startswith("."):  # a build under way or interrupted
            if repo.is_dir() and stale(repo, building=True):
                remove(repo)
            continue
        if not repo.is_dir():
            continue
        record = repo.with_name(repo.name + ".json")
        if record.is_file() and not stale(record, building=False):
            kept_envs.add(json.loads(record.read_text()).get("env", ""))
            continue
        remove(repo)
        for leftover in (record, repo.with_name(repo.name + ".prepare.log")):
            if leftover.is_file():
                remove(leftover)
        pruned.repos += 1
    envs = root / "envs"
    for env in sorted(envs.iterdir()) if envs.is_dir() else []:
        building = env.name.startswith(".")
        record = env / "env.json"
        if str(env) in kept_envs or (record.is_file() and not stale(record, building=False)):
            continue
        if building and not stale(env, building=True):
            continue
        remove(env)
        pruned.envs += 0 if building else 1
    pythons = root / "pythons"
    used = {directory for env in (envs.iterdir() if envs.is_dir() else []) if (env / "env.json").is_file()
            for directory in json.loads((env / "env.json").read_text()).get("mounts", {}).values()}
    if envs.is_dir() and any(env.name.startswith(".") for env in envs.iterdir()):
        return pruned  # an environment being built may use an interpreter it has not recorded yet
    for python in sorted(pythons.iterdir()) if pythons.is_dir() else []:
        if str(python) not in used and (not python.name.startswith(".") or stale(python, building=True)):
            remove(python)
    return pruned
