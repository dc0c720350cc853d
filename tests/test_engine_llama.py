"""The llama.cpp engine: its build (steps, errors), the `llama-server` command line, bad model files, the real server
batching several conversations in parallel slots under the JSON tool-call schema, and the GPU path's refusals on a
machine without GPUs. The real-server tests use the build examples/setup.sh makes (uni_agent/engines/llama_build.py);
they are skipped, saying so, when it is missing."""

import asyncio
import io
import json
import os
import re
import shutil
import tarfile
import time
from pathlib import Path

import httpx
import pytest

from conftest import AGENT_CONFIG
from uni_agent.engines import ENGINES
from uni_agent.engines.llama_build import (
    COMMON_FLAGS,
    QUICK_FLAGS,
    LlamaBuildError,
    SOURCE_VERSION,
    binary_path,
    build,
    configure,
    configure_flags,
    find_binary,
    recipe_key,
)
from uni_agent.engines.llama_cpp import (
    LlamaServer,
    check_gguf,
    default_model_path,
    server_command,
    servers_per_group,
)
from uni_agent.engines.placement import PlacementError
from uni_agent.engines.shared_prompt import SLOT_FILE, share_prompt
from uni_agent.private_dirs import dask_dir
from uni_agent.tool_calls import tool_call_json_schema

CPU_SERVER = find_binary("cpu")
needs_server = pytest.mark.skipif(CPU_SERVER is None, reason="no llama-server build: run examples/setup.sh")


# ---- the build ----------------------------------------------------------------------------------------------------

def test_cpu_build_is_portable_and_cuda_needs_a_gpu():
    cpu = configure_flags("cpu")
    assert "-DGGML_NATIVE=OFF" in cpu and "-DGGML_AVX2=ON" in cpu and "-DGGML_AVX512=OFF" in cpu
    assert "-DLLAMA_USE_PREBUILT_UI=OFF" in cpu  # nothing is fetched during the build
    assert configure_flags("cuda", "90", "plain") == COMMON_FLAGS + ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90",
                                                                     "-DGGML_NATIVE=OFF"]
    assert configure_flags("cuda", "90") == configure_flags("cuda", "90", "plain") + QUICK_FLAGS
    with pytest.raises(LlamaBuildError, match="nvidia-smi found no GPU"):
        configure_flags("cuda", "")
    with pytest.raises(LlamaBuildError, match="unknown llama-server variant 'rocm'"):
        configure_flags("rocm")
    with pytest.raises(LlamaBuildError, match="unknown llama-server build recipe 'fast'"):
        configure_flags("cpu", recipe="fast")


def test_each_recipe_and_each_change_of_its_flags_has_its_own_cache(monkeypatch):
    keys = {recipe_key(v, r) for v in ("cpu", "cuda") for r in ("quick", "plain")}
    assert len(keys) == 4 and all(k.startswith(f"{SOURCE_VERSION}-") for k in keys)
    assert binary_path("cpu").parent.parent.name == recipe_key("cpu", "quick")  # quick is the default
    before = recipe_key("cpu")
    monkeypatch.setattr("uni_agent.engines.llama_build.QUICK_CMAKE", "include_guard(GLOBAL)\n")
    assert recipe_key("cpu") != before and recipe_key("cpu", "plain") == recipe_key("cpu", "plain")


@pytest.mark.skipif(shutil.which("cmake") is None, reason="no cmake: run examples/setup.sh")
def test_the_quick_recipe_keeps_the_hot_code_at_O3_and_batches_the_rest_at_O1(tmp_path):
    """Configured on a small project laid out like llama.cpp (the same target and file names): the flags each file
    gets, as CMake's compile_commands.json records them (the last -O on a gcc command line counts)."""
    source = tmp_path / "src"
    files = {
        "CMakeLists.txt": "cmake_minimum_required(VERSION 3.14)\nproject(llama.cpp C CXX)\n"
                          "add_library(ggml-cpu STATIC ops.cpp)\nadd_subdirectory(src)\nadd_subdirectory(common)\n"
                          "add_subdirectory(tools/mtmd)\n",
        "src/CMakeLists.txt": "add_library(llama STATIC llama-grammar.cpp llama-model.cpp)\n",
        "common/CMakeLists.txt": "add_library(llama-common STATIC chat.cpp arg.cpp json.cpp sampling.cpp)\n",
        "tools/mtmd/CMakeLists.txt": "add_library(mtmd STATIC mtmd.cpp clip.cpp mtmd-helper.cpp)\n",
    }
    for name in ["ops.cpp", "src/llama-grammar.cpp", "src/llama-model.cpp", "common/chat.cpp", "common/arg.cpp",
                 "common/json.cpp", "common/sampling.cpp", "tools/mtmd/mtmd.cpp", "tools/mtmd/clip.cpp",
                 "tools/mtmd/mtmd-helper.cpp"]:
        files[name] = "int f_%d() { return 0; }\n" % len(files)
    for name, text in files.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_text(text)
    flags = [f for f in configure_flags("cpu") if "BUILD_TYPE" in f or "FLAGS_RELEASE" in f]
    configure(source, tmp_path / "build", flags, "quick", tmp_path)
    commands = json.loads((tmp_path / "build" / "compile_commands.json").read_text())
    last_opt = {Path(c["file"]).name: [w for w in c["command"].split() if w.startswith("-O")][-1] for c in commands}
    assert last_opt["ops.cpp"] == last_opt["llama-grammar.cpp"] == last_opt["sampling.cpp"] == "-O3"
    assert last_opt["llama-model.cpp"] == "-O1"
    units = [c["command"] for c in commands if "/Unity/unity_" in c["file"]]
    assert len(units) == 2 and all(c.split().count("-O1") == 1 and "-O3" not in c for c in units)  # chat+arg, mtmd+clip
    assert not {"chat.cpp", "arg.cpp", "mtmd.cpp", "clip.cpp"} & set(last_opt)
    assert last_opt["json.cpp"] == last_opt["mtmd-helper.cpp"] == "-O1"  # files that cannot share a unit: alone


def _sdist(path: Path, files: dict[str, str]) -> Path:
    """A tar.gz laid out like the llama-cpp-python sdist, holding `files` under vendor/llama.cpp/."""
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"llama_cpp_python-{SOURCE_VERSION}/vendor/llama.cpp/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_failed_build_names_the_step_and_its_log(tmp_path, monkeypatch):
    monkeypatch.setenv("UNI_AGENT_LLAMA_DIR", str(tmp_path / "cache"))
    broken = _sdist(tmp_path / f"llama_cpp_python-{SOURCE_VERSION}.tar.gz", {
        "CMakeLists.txt": 'cmake_minimum_required(VERSION 3.14)\nproject(x)\nmessage(FATAL_ERROR "no such backend")\n'})
    with pytest.raises(LlamaBuildError) as info:
        build("cpu", sdist=broken, quiet=True)
    message = str(info.value)
    log = binary_path("cpu").parent.parent / "logs" / "configure.log"
    assert "failed at step 'configure'" in message and str(log) in message and "no such backend" in message
    assert "no such backend" in log.read_text()
    assert find_binary("cpu") is None  # nothing half-built is left where the engine looks

    wrong = tmp_path / "other.tar.gz"
    with tarfile.open(wrong, "w:gz") as tar:
        tar.addfile(tarfile.TarInfo("README"), io.BytesIO(b""))
    with pytest.raises(LlamaBuildError, match="holds no .*vendor/llama.cpp/: not the llama-cpp-python sdist"):
        build("cpu", sdist=wrong, quiet=True)


def test_the_first_build_makes_the_users_cache_private(tmp_path, monkeypatch):
    """Setup's build is the first to write under ~/.cache/uni-agent: made with the umask's 0755, another user could
    list it and the build until the first run narrowed it (the attacker run of 2026-12-05 did, for the whole build)."""
    monkeypatch.delenv("UNI_AGENT_LLAMA_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    broken = _sdist(tmp_path / f"llama_cpp_python-{SOURCE_VERSION}.tar.gz", {
        "CMakeLists.txt": 'cmake_minimum_required(VERSION 3.14)\nproject(x)\nmessage(FATAL_ERROR "stop here")\n'})
    old_umask = os.umask(0o022)
    try:
        with pytest.raises(LlamaBuildError, match="stop here"):
            build("cpu", sdist=broken, quiet=True)
    finally:
        os.umask(old_umask)
    users_cache = tmp_path / "home" / ".cache" / "uni-agent"
    assert binary_path("cpu").is_relative_to(users_cache / "llama.cpp")
    assert (users_cache / "llama.cpp").is_dir() and users_cache.stat().st_mode & 0o777 == 0o700


# ---- command line and model files --------------------------------------------------------------------------------

def test_server_command_line():
    cmd = server_command("/b/llama-server", "/m/x.gguf", "x", host="10.0.0.5", port=9000, slots=8,
                         context_length=4096, threads=2, gpu=False)
    assert cmd[0] == "/b/llama-server" and cmd[cmd.index("--model") + 1] == "/m/x.gguf"
    assert cmd[cmd.index("--parallel") + 1] == "8"
    assert cmd[cmd.index("--ctx-size") + 1] == str(8 * 4096)  # each slot gets the whole context_length
    assert "--cont-batching" in cmd and "--n-gpu-layers" not in cmd
    assert "--no-slots" in cmd  # no slot listing for anyone (tests/test_security_engines.py)
    assert not any("key" in arg for arg in cmd)  # the API key goes in the environment, never on a command line
    gpu = server_command("/b/llama-server", "/m/x.gguf", "x", host="h", port=1, slots=128, context_length=8192,
                         threads=4, gpu=True)
    assert gpu[gpu.index("--n-gpu-layers") + 1] == "999"
    assert "--slot-save-path" not in cmd
    shared = server_command("/b/llama-server", "/m/x.gguf", "x", host="h", port=1, slots=2, context_length=512,
                            threads=1, gpu=False, slot_save_path="/logs/engine-0.slots")
    assert shared[shared.index("--slot-save-path") + 1] == "/logs/engine-0.slots"


def test_several_servers_share_each_gpu_group():
    groups = [("tcp://a:1", "0,1"), ("tcp://b:1", "2")]
    assert servers_per_group(groups, 1) == [(0, "tcp://a:1", "0,1"), (1, "tcp://b:1", "2")]
    assert servers_per_group(groups, 2) == [(0, "tcp://a:1", "0,1"), (1, "tcp://a:1", "0,1"),
                                            (2, "tcp://b:1", "2"), (3, "tcp://b:1", "2")]


def test_bad_model_files_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"--model-path .*missing.gguf: no such GGUF file"):
        check_gguf(str(tmp_path / "missing.gguf"))
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 a zip file, not a model")
    with pytest.raises(ValueError, match=r"model.gguf: not a GGUF file \(it starts with b'PK\\x03\\x04'"):
        check_gguf(str(fake))
    assert check_gguf(default_model_path()).endswith(".gguf")


def test_every_engine_is_one_entry_of_the_seam():
    from uni_agent.engines import check_engine
    from uni_agent.settings import RunSettings

    for name in ENGINES:
        check_engine(RunSettings(engine=name))  # a run checks the name against the registry, and imports its module
        assert callable(ENGINES.get(name))


# ---- the real server -----------------------------------------------------------------------------------------------

TOOLS = [
    {"type": "function", "function": {"name": "execute_bash", "description": "Run a bash command.",
     "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
    {"type": "function", "function": {"name": "submit", "description": "Finish.",
     "parameters": {"type": "object", "properties": {}}}},
]


@pytest.mark.llm
@needs_server
def test_parallel_slots_batch_conversations_and_keep_their_prefix(tmp_path):
    """Four two-turn conversations at once on a 4-slot server: all four run together (continuous batching), every
    reply is a valid tool call under the schema, and each second turn reads only its new tokens (its slot kept the
    first turn's prompt)."""
    server = LlamaServer(default_model_path(), "smol", variant="cpu", slots=4, context_length=2048,
                         threads=os.cpu_count() or 2, log_path=str(tmp_path / "engine.log"), api_key="run-key")
    schema = {"type": "json_object", "schema": tool_call_json_schema(TOOLS)}
    complete = []

    async def conversation(http, url, i):
        messages = [{"role": "system", "content": f"You are agent {i}. Reply with one JSON tool call. " * 20},
                    {"role": "user", "content": f"Task {i}: list the files in /tmp/{i}."}]
        usage = []
        for _turn in range(2):
            body = {"model": "smol", "messages": messages, "max_tokens": 128, "temperature": 0.5,
                    "response_format": schema}
            reply = (await http.post(f"{url}/chat/completions", json=body)).json()
            content = reply["choices"][0]["message"]["content"]
            if reply["choices"][0]["finish_reason"] == "stop":  # a whole reply is a valid call, nothing else
                call = json.loads(content)
                assert call["name"] in ("execute_bash", "submit") and isinstance(call["arguments"], dict)
                complete.append(call)
            else:  # cut by max_tokens: still the schema's start (the grammar allows any JSON whitespace there)
                assert re.match(r'\{\s*"name"', content), content
            usage.append((reply["usage"]["prompt_tokens"], reply["timings"]["prompt_n"]))
            messages += [reply["choices"][0]["message"], {"role": "user", "content": "Observation: a b c"}]
        return usage

    async def main():
        url = await server.start(120)
        try:
            async with httpx.AsyncClient(timeout=300, headers={"Authorization": "Bearer run-key"}) as http:
                started = time.monotonic()
                results = await asyncio.gather(*(conversation(http, url, i) for i in range(4)))
                wall = time.monotonic() - started
                slots = (await http.get(url.removesuffix("/v1") + "/props")).json()["total_slots"]
                metrics = (await http.get(url.removesuffix("/v1") + "/metrics")).text
            return results, wall, slots, metrics
        finally:
            await server.stop()

    results, wall, slots, metrics = asyncio.run(main())
    assert slots == 4 and len(complete) >= 2, complete  # a tiny model may ramble in a string: some finish
    busy = [float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("llamacpp:n_busy_slots_per")]
    assert busy and busy[0] > 1.5, metrics  # decode steps served several slots at once
    for (first_prompt, _), (second_prompt, second_read) in results:
        assert second_prompt > first_prompt
        assert second_read < second_prompt - first_prompt + 16, results  # the shared prefix came from the slot cache
    assert not asyncio.run(server.alive())


@needs_server
def test_the_shared_prompt_is_read_once_and_every_slot_starts_with_it(tmp_path):
    """share_prompt reads one opening request into a slot and copies it into the other three; then four first-turn
    requests at once (the first wave), each with its own task after the shared system prompt, all find the prefix
    cached and read only their own tokens. Without the sharing, the same wave reads the whole prompt in each slot."""
    system = {"role": "system", "content": "You are a careful engineer. Reply with one JSON tool call. " * 40}

    def opening(i):
        return [system, {"role": "user", "content": f"Task {i}: list the files in /tmp/{i}."}]

    async def wave(share):
        server = LlamaServer(default_model_path(), "smol", variant="cpu", slots=4, context_length=1024,
                             threads=os.cpu_count() or 2, log_path=str(tmp_path / f"engine-{share}.log"),
                             api_key="run-key", slot_saving=share)
        url = await server.start(120)
        try:
            shared = await share_prompt([url], "smol", opening(0), None, api_key="run-key") if share else []
            assert (server.slot_dir / SLOT_FILE).exists() == share
            if share:  # the server writes there as us: a directory of ours alone
                assert server.slot_dir.stat().st_mode & 0o777 == 0o700
            async with httpx.AsyncClient(timeout=300, headers={"Authorization": "Bearer run-key"}) as http:
                replies = await asyncio.gather(*(http.post(f"{url}/chat/completions", json={
                    "model": "smol", "messages": opening(i), "max_tokens": 1}) for i in range(1, 5)))
            return shared, [(r.json()["usage"]["prompt_tokens"], r.json()["timings"]["prompt_n"]) for r in replies]
        finally:
            await server.stop()
            assert not server.slot_dir.exists()  # the saved cache (tens of MB) goes with the server

    shared, with_sharing = asyncio.run(wave(True))
    _, without = asyncio.run(wave(False))
    assert len(shared) == 1 and shared[0]["slots"] == 4 and shared[0]["prompt_tokens"] > 400, shared
    assert all(read < 40 for _, read in with_sharing), with_sharing  # only the task's own tokens were read
    # Without it, the wave's requests read the whole prompt, except those that arrive after another one finished and
    # are given its slot (how many do depends on the machine's speed): at least one read all of it.
    assert max(read for _, read in without) >= without[0][0] > 400, without


# ---- the GPU path on a machine without GPUs ------------------------------------------------------------------------

@needs_server
def test_gpu_engine_without_gpus_is_refused(tmp_path, monkeypatch):
    """engine_device gpu: no GPU worker is a PlacementError before anything starts; a worker that declares a GPU it
    does not have is refused by the CUDA build's own device check (here: the CPU build standing in for the CUDA
    build, which cannot be made without a GPU, so the check finds no CUDA device), and its lease is released."""
    from distributed import Client, LocalCluster

    from uni_agent import run
    from uni_agent.engines.placement import LEASES_PLUGIN

    monkeypatch.setenv("UNI_AGENT_LLAMA_DIR", str(tmp_path / "llama"))
    binary_path("cuda").parent.mkdir(parents=True)
    shutil.copy2(CPU_SERVER, binary_path("cuda"))
    common = dict(engine="llama_cpp", engine_device="gpu", n_gpus_per_node=1, max_samples=1, progress=False,
                  output_dir=str(tmp_path / "out"), engine_start_timeout=60,
                  worker_wait_timeout=3)  # a cluster started apart is given time for GPU workers to join: not here
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, host="127.0.0.1", dashboard_address=":0",
                      resources={"SANDBOX": 8}, local_directory=str(dask_dir())) as cluster, Client(cluster) as client:
        with pytest.raises(PlacementError, match="there are none"):
            run(None, AGENT_CONFIG, client=client, **common)
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, host="127.0.0.1", dashboard_address=":0",
                      resources={"GPU": 1, "SANDBOX": 8}, local_directory=str(dask_dir())) as cluster, Client(cluster) as client:
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="declares GPUs but the CUDA build sees none"):
            run(None, AGENT_CONFIG, client=client, **common)
        assert time.monotonic() - started < 60
        leases = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins[LEASES_PLUGIN].busy())
        assert leases == {}
