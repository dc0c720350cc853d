"""How long the llama-server build takes with each recipe of uni_agent.engines.llama_build, side by side: `plain`
(upstream's Release flags, every file alone at -O3: what the project built before the quick recipe) and `quick`
(the default), built at the same time from the same sdist, each pinned to its own cores (2 each by default, the
quickstart's machine) with as many compile jobs as it has cores. Prints the wall and CPU time of each and the ratio:

    python cluster/build_bench.py [--sdist FILE] [--cores 0,1:2,3] [--recipes plain,quick] [--out DIR]
                                  [--model FILE.gguf]
    python cluster/build_bench.py --model FILE.gguf --binaries plain=PATH,quick=PATH [--cores 0,1:0,1]

The two builds run in separate temporary caches (UNI_AGENT_LLAMA_DIR under --out), never in the user's cache. With
--model, it then serves the model with each binary in turn (pinned to the same cores, 8 slots, --threads = cores)
and measures decoding tokens/s without and with the JSON tool-call schema (cluster/grammar_bench.py), 3 times in
alternation, so that a quicker build is seen not to cost decoding speed; --binaries compares builds made earlier
without building. Writes build_bench.json to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Loaded and run by its path: it needs only the standard library, so this runs where the package's dependencies are
# not installed (the GPU machine), and importing uni_agent would need them.
BUILDER = REPO / "uni_agent" / "engines" / "llama_build.py"
_spec = importlib.util.spec_from_file_location("llama_build", BUILDER)
llama_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(llama_build)


def download_sdist(dest: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "-d", str(dest),
                    f"{llama_build.SOURCE_PACKAGE}=={llama_build.SOURCE_VERSION}"], check=True)
    return next(dest.glob("*.tar.gz"))


def ninja_steps(ninja_log: Path) -> list[tuple[int, int, str]]:
    """(start ms, end ms, output) of every compile and link step, from ninja's own log."""
    rows = [line.split("\t") for line in ninja_log.read_text().splitlines()[1:] if line.strip()]
    return [(int(r[0]), int(r[1]), r[3]) for r in rows]


def library_of(output: str) -> str:
    """The library a step's output belongs to: 'common/CMakeFiles/llama-common.dir/x.o' -> 'llama-common'."""
    parts = output.split("/")
    return next((p.removesuffix(".dir") for p in parts if p.endswith(".dir")), parts[-1])


def build_side_by_side(sdist: Path, recipes: list[str], cores: list[list[int]], out: Path, variant: str) -> list[dict]:
    """Starts every recipe's build at once, each on its own cores, and waits for all; one dict a recipe."""
    running = {}
    for recipe, cpus in zip(recipes, cores):
        cache = out / recipe
        env = {**os.environ, "UNI_AGENT_LLAMA_DIR": str(cache)}
        log = open(out / f"{recipe}.out", "wb")  # noqa: SIM115 - the child keeps it
        proc = subprocess.Popen([sys.executable, str(BUILDER), "--variant", variant, "--recipe", recipe, "--sdist",
                                 str(sdist), "--jobs", str(len(cpus))], stdout=log, stderr=subprocess.STDOUT, env=env,
                                preexec_fn=lambda cpus=cpus: os.sched_setaffinity(0, cpus))
        running[proc.pid] = (recipe, cpus, cache, time.monotonic())
        print(f"build_bench: {recipe} building on cores {','.join(map(str, cpus))} (log {out / f'{recipe}.out'})",
              flush=True)
    results = []
    while running:
        pid, status, usage = os.wait4(-1, 0)  # the rusage of one build: every compiler it ran, reaped
        if pid not in running:
            continue
        recipe, cpus, cache, started = running.pop(pid)
        wall = time.monotonic() - started
        binary = cache / llama_build.recipe_key(variant, recipe) / "bin" / "llama-server"
        row = {"recipe": recipe, "cores": cpus, "ok": os.waitstatus_to_exitcode(status) == 0, "wall_s": round(wall, 1),
               "cpu_s": round(usage.ru_utime + usage.ru_stime, 1), "binary": str(binary)}
        ninja_log = binary.parent.parent / "logs" / "ninja_log.txt"
        if ninja_log.exists():
            steps = ninja_steps(ninja_log)
            row["compile_wall_s"], row["steps"] = max(e for _, e, _ in steps) / 1000, len(steps)
            by_library: dict[str, float] = {}
            for start, end, output in steps:
                by_library[library_of(output)] = by_library.get(library_of(output), 0) + (end - start) / 1000
            row["compile_s_by_library"] = {k: round(v, 1) for k, v in sorted(by_library.items(), key=lambda kv: -kv[1])}
        if row["ok"]:
            row["binary_mb"] = round(binary.stat().st_size / 2**20, 1)
        results.append(row)
        print(f"build_bench: {recipe} {'done' if row['ok'] else 'FAILED'} after {wall:.0f} s", flush=True)
    return sorted(results, key=lambda r: recipes.index(r["recipe"]))


def decode_speed(results: list[dict], model: str, out: Path, rounds: int = 3) -> list[dict]:
    """Each build serves the model in turn (alternating, `rounds` times) on its own cores; tokens/s rows."""
    sys.path.insert(0, str(REPO / "cluster"))
    from grammar_bench import measure, serve

    rows = []
    for round_no in range(rounds):
        for r in results:
            label = f"{r['recipe']}#{round_no + 1}"
            proc = serve(r["binary"], model, out / f"serve-{label}.log", slots=8, cores=r["cores"],
                         extra=["--threads", str(len(r["cores"]))])
            try:
                rows += asyncio.run(measure(label, concs=(8,), pid=proc.pid))
            finally:
                proc.terminate()
                proc.wait()
    return rows


def print_decode(rows: list[dict]) -> None:
    """Tokens per second and per server CPU second of each build and kind, every round, and the mean of the rounds."""
    for key, what in (("tokens_per_s", "tokens/s"), ("tokens_per_cpu_s", "tokens per server CPU second")):
        print(f"\ndecoding, 8 concurrent requests of up to 128 tokens ({what}, each round, then the mean):")
        table: dict[tuple[str, str], list[float]] = {}
        for row in rows:
            table.setdefault((row["label"].split("#")[0], row["kind"]), []).append(row[key] or 0.0)
        for (build, kind), rates in table.items():
            mean = sum(rates) / len(rates)
            print(f"{build:8s} {kind:7s} " + " ".join(f"{r:6.1f}" for r in rates) + f"   mean {mean:6.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sdist", type=Path, default=None, help="the llama-cpp-python sdist (default: pip download)")
    parser.add_argument("--recipes", default="plain,quick")
    parser.add_argument("--cores", default=None,
                        help="cores of each recipe, ':' between recipes (default: 2 each from the usable cores)")
    parser.add_argument("--variant", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--out", type=Path, default=None, help="for the builds, logs, JSON (default: a temp dir)")
    parser.add_argument("--model", default=None, help="a GGUF: also compare the builds' decoding tokens/s")
    parser.add_argument("--binaries", default=None, help="LABEL=PATH,...: only compare these builds' decoding")
    args = parser.parse_args(argv)
    given = dict(pair.split("=", 1) for pair in args.binaries.split(",")) if args.binaries else {}
    recipes = list(given) or args.recipes.split(",")
    usable = sorted(os.sched_getaffinity(0))
    if args.cores:
        cores = [[int(c) for c in group.split(",")] for group in args.cores.split(":")]
    else:
        cores = [usable[2 * i:2 * i + 2] for i in range(len(recipes))]
    if len(cores) != len(recipes) or any(len(c) == 0 for c in cores):
        parser.error(f"{len(recipes)} recipes need {len(recipes)} core groups ({len(usable)} usable cores here)")
    out = args.out or Path(tempfile.mkdtemp(prefix="build-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    if given:
        if not args.model:
            parser.error("--binaries needs --model")
        builds = [{"recipe": label, "binary": path, "cores": cpus} for (label, path), cpus in zip(given.items(), cores)]
        report = {"decode": decode_speed(builds, args.model, out), "load_before": round(os.getloadavg()[0], 2)}
        print_decode(report["decode"])
        (out / "build_bench.json").write_text(json.dumps(report, indent=2))
        return 0
    sdist = args.sdist or download_sdist(out)
    load = os.getloadavg()[0]
    results = build_side_by_side(sdist.resolve(), recipes, cores, out.resolve(), args.variant)
    report = {"sdist": sdist.name, "variant": args.variant, "load_before": round(load, 2),
              "load_after": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(), "builds": results}
    print(f"\nllama-server {args.variant} build from the {llama_build.SOURCE_PACKAGE} {llama_build.SOURCE_VERSION} "
          f"sdist, side by side (load average {load:.1f} before):")
    print(f"{'recipe':8s} {'cores':8s} {'wall s':>7s} {'compile s':>9s} {'CPU s':>7s} {'steps':>5s} {'MB':>5s}")
    for r in results:
        print(f"{r['recipe']:8s} {','.join(map(str, r['cores'])):8s} {r['wall_s']:7.0f} "
              f"{r.get('compile_wall_s', 0):9.0f} {r['cpu_s']:7.0f} {r.get('steps', 0):5d} {r.get('binary_mb', 0):5.1f}"
              f"{'' if r['ok'] else '  FAILED: see ' + str(out / (r['recipe'] + '.out'))}")
    ok = [r for r in results if r["ok"]]
    libraries = [lib for lib in results[0].get("compile_s_by_library", {}) if lib]
    if libraries:
        print("\ncompile seconds by library (each step's wall time, added up):")
        print(f"{'library':18s}" + "".join(f"{r['recipe']:>9s}" for r in results))
        for lib in libraries[:10]:
            print(f"{lib:18s}" + "".join(f"{r.get('compile_s_by_library', {}).get(lib, 0):9.0f}" for r in results))
    if len(ok) == len(results) >= 2:
        base = results[0]
        for r in results[1:]:
            print(f"{r['recipe']} vs {base['recipe']}: {base['wall_s'] / r['wall_s']:.2f}x faster wall, "
                  f"{base['cpu_s'] / r['cpu_s']:.2f}x less CPU")
    if args.model and ok:
        report["decode"] = decode_speed(ok, args.model, out)
        print_decode(report["decode"])
    (out / "build_bench.json").write_text(json.dumps(report, indent=2))
    print(f"build_bench: {out / 'build_bench.json'}")
    return 0 if len(ok) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
