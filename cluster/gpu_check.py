"""Check GPU isolation of engine replicas before a long run, without vLLM: uni-agent's placement and server-actor
path start one small probe server per replica (in place of `vllm serve`); each probe takes some memory on the
GPUs it was given and reports what it sees. The check passes when every replica sees exactly its own tp devices,
no device is seen by two replicas, and nvidia-smi shows one probe process on each device.

    python cluster/gpu_check.py --gpus 2                    # a local dask cluster with one GPU=2 worker
    python cluster/gpu_check.py --scheduler-file F --nnodes 2 --gpus 8 --tp 2   # the GPU workers of a cluster

Needs torch where the probes run (the GPU workers). Prints one JSON line per replica, nvidia-smi's view, and
PASS or FAIL (exit code 0 or 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing


def serve(argv: list[str]) -> None:
    """The probe: `gpu_check.py serve MODEL ... --host H --port P` (the arguments `vllm serve` would get)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import torch

    host, port = argv[argv.index("--host") + 1], int(argv[argv.index("--port") + 1])
    count = torch.cuda.device_count()
    held = [torch.ones(256 * 1024 * 1024, dtype=torch.float32, device=f"cuda:{i}") for i in range(count)]  # 1 GiB each
    torch.cuda.synchronize()
    info = {"pid": os.getpid(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "device_count": count, "names": [torch.cuda.get_device_name(i) for i in range(count)],
            "uuids": [f"GPU-{torch.cuda.get_device_properties(i).uuid}" for i in range(count)],
            "allocated_gib": [round(torch.cuda.memory_allocated(i) / 2**30, 2) for i in range(count)],
            "sum": [float(t.sum().item()) for t in held]}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            body = json.dumps({"object": "list", "data": [{"id": "gpu-probe"}], "gpu": info}).encode()
            self.send_response(200 if self.path.rstrip("/") == "/v1/models" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    print(f"probe on {host}:{port}: {info}", flush=True)
    ThreadingHTTPServer((host, port), Handler).serve_forever()


def nvidia_smi() -> tuple[dict[str, str], list[dict[str, str]]]:
    """{uuid: index} and the compute processes, as nvidia-smi reports them."""
    def query(*args: str) -> list[list[str]]:
        out = subprocess.run(["nvidia-smi", *args, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             check=True).stdout
        return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]

    gpus = {uuid: index for index, uuid in query("--query-gpu=index,uuid")}
    apps = [dict(zip(("pid", "gpu_uuid", "used_mib"), row))
            for row in query("--query-compute-apps=pid,gpu_uuid,used_memory")]
    return gpus, apps


async def check(args: argparse.Namespace) -> bool:
    from distributed import Client, LocalCluster

    from uni_agent.driver.tls import client_security, local_security, scheduler_file_address
    from uni_agent.engines.vllm import VllmServer
    from uni_agent.engines.placement import place_replicas, release_replicas

    started = time.monotonic()
    # TLS either way: the cluster's files (UNI_AGENT_TLS_DIR) for a scheduler file, temporary ones for a local cluster
    address = await scheduler_file_address(args.scheduler_file) if args.scheduler_file else None
    security = client_security(address, os.environ.get("UNI_AGENT_TLS_DIR")) if address else None
    async with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, asynchronous=True, host="127.0.0.1",
                            dashboard_address="127.0.0.1:0", protocol="tls://", security=local_security(),
                            resources={"GPU": args.gpus}) if not args.scheduler_file \
            else _nothing() as cluster, \
            Client(cluster if cluster is not None else address, security=security, asynchronous=True) as client:
        replicas = await place_replicas(client, tp=args.tp, nnodes=args.nnodes, n_gpus_per_node=args.gpus)
        command_args = {"executable": f"{sys.executable} {Path(__file__).resolve()}", "model": "gpu-probe",
                        "served_name": "gpu-probe", "tp": args.tp, "gpu_memory_utilization": 0.9,
                        "max_model_len": 1024, "tool_call_parser": "hermes"}
        log_dir = Path(args.log_dir).resolve()
        actors, futures = [], []
        try:
            for r in replicas:
                future = client.submit(VllmServer, command_args, r.cuda_visible_devices,
                                       str(log_dir / f"probe-{r.index}.log"), actor=True, workers=[r.worker],
                                       key=f"gpu-probe-{r.index}")
                futures.append(future)
                actors.append(await future)
            urls = await asyncio.gather(*(a.start(args.timeout) for a in actors))
            print(f"{len(replicas)} replicas ready in {time.monotonic() - started:.1f}s", flush=True)
            seen = []
            async with httpx.AsyncClient(timeout=10) as http:
                for r, url in zip(replicas, urls):
                    gpu = (await http.get(f"{url}/models")).json()["gpu"]
                    seen.append(gpu)
                    print(json.dumps({"replica": r.index, "worker": r.worker, "assigned": r.cuda_visible_devices,
                                      "url": url, **gpu}), flush=True)
            await asyncio.sleep(args.hold)
            ok = True
            try:
                index_of, apps = nvidia_smi()
                print("nvidia-smi compute processes:", json.dumps(apps), flush=True)
            except (OSError, subprocess.CalledProcessError) as exc:
                index_of, apps = {}, []
                print(f"nvidia-smi unavailable ({exc}); skipping its part of the check", flush=True)
            all_uuids = [u for gpu in seen for u in gpu["uuids"]]
            ok &= all(gpu["device_count"] == args.tp for gpu in seen)
            ok &= len(all_uuids) == len(set(all_uuids))
            for gpu in seen:
                if index_of:  # the probe is the one process of ours on each of its devices, and on no other
                    ok &= sorted(index_of[u] for u in gpu["uuids"]) == sorted(gpu["cuda_visible_devices"].split(","))
                    mine = [a["gpu_uuid"] for a in apps if a["pid"] == str(gpu["pid"])]
                    ok &= sorted(mine) == sorted(gpu["uuids"]) if mine else True  # pids hidden in some containers
                    ok &= all(sum(a["gpu_uuid"] == u for a in apps) == 1 for u in gpu["uuids"])
            print("PASS" if ok else "FAIL", flush=True)
            return ok
        finally:
            for actor in actors:
                await actor.stop()
            await release_replicas(client)


class _nothing:
    async def __aenter__(self):
        return None

    async def __aexit__(self, *exc):
        return False


def main() -> int:
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scheduler-file", help="check the GPU workers of this cluster (default: a local one)")
    p.add_argument("--gpus", type=int, default=2, help="GPUs per node (the local worker declares GPU=N)")
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--hold", type=float, default=0, help="seconds to keep the probes up before reading nvidia-smi")
    p.add_argument("--timeout", type=float, default=180)
    p.add_argument("--log-dir", default="gpu-check-logs")
    return 0 if asyncio.run(check(p.parse_args())) else 1


if __name__ == "__main__":
    sys.exit(main())
