"""Run a short job and save pictures of the live page and of the report for docs/outputs.md:
docs/dashboard.png (mid-run), docs/dashboard-rollout.png (a rollout's detail view) and docs/report.png.

    .venv/bin/python examples/screenshots.py [--out-dir docs] [--run-dir outputs/screenshots]

The job: 8 bundled tasks x 3 rollouts on a local Dask cluster, real bubblewrap sandboxes and real verification, with
a scripted OpenAI-compatible model (uni_agent.testing.scripted_llm) that answers after a delay so that the run lasts
long enough to watch. Its policy gives a mix of outcomes: tasks solved with the gold patch, empty submissions,
rollouts that run out of turns, and one task whose endpoint refuses (HTTP 403), so its rollouts fail.

Needs Debian's Chromium (`apt-get install -y chromium`) and the playwright package (the `test` extra); it drives
/usr/bin/chromium and never downloads a browser.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import shutil
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def make_policy(rows):
    from uni_agent.tasks.swe_form import BUNDLED_DIR
    from uni_agent.testing.scripted_llm import Fault, tool_call_message

    instances = {r["instance_id"]: json.loads((BUNDLED_DIR / r["instance_id"] / "instance.json").read_text())
                 for r in rows}
    order = [r["instance_id"] for r in rows]

    def policy(body):
        user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        instance_id = next(i for i, inst in instances.items() if inst["problem_statement"].strip() in user)
        kind = (order.index(instance_id) + 6) % len(order)  # the refused task (7) comes second: failures show early
        assistant = [m for m in body["messages"] if m["role"] == "assistant"]
        turn = len(assistant)
        seed = assistant[0]["tool_calls"][0]["id"] if assistant else ""  # differs per rollout
        if kind == 7:
            return Fault(403, '{"error": {"message": "forbidden: this key may not use the model"}}')
        if turn == 0:
            return tool_call_message("execute_bash", {"command": "git log --oneline | head -3 && ls"})
        if kind == 6:  # explores until it runs out of turns
            return tool_call_message("execute_bash", {"command": f"grep -rn def . | head -{turn * 5}"})
        if kind < 4 and turn == 1 and random.Random(seed).random() < 0.75:
            patch = instances[instance_id]["patch"]
            return tool_call_message("execute_bash", {"command": f"cat > /tmp/fix.diff <<'EOF'\n{patch}EOF\n"
                                                                 "git apply /tmp/fix.diff && git diff --stat"})
        if turn < 3:
            command = "python -m pytest -q -p no:cacheprovider 2>&1 | tail -3"
            return tool_call_message("execute_bash", {"command": command})
        return tool_call_message("submit", {})

    return policy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", default=str(REPO / "docs"))
    parser.add_argument("--run-dir", default=str(REPO / "outputs" / "screenshots"),
                        help="the job's output dir (replaced; default outputs/screenshots)")
    parser.add_argument("--delay", type=float, default=0.6, help="seconds per scripted reply")
    args = parser.parse_args(argv)

    from distributed import Client, LocalCluster
    from playwright.sync_api import sync_playwright

    from uni_agent import AgentConfigs, run
    from uni_agent.dashboard import page_token
    from uni_agent.driver.dataset import read_rows
    from uni_agent.reports.run_report import write_report
    from uni_agent.tasks.swe_form import convert
    from uni_agent.testing.scripted_llm import ScriptedLLM

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(args.run_dir)
    if work.exists() and any(work.iterdir()):
        if not (work / "tasks.parquet").exists():  # only ever replace a directory this script made
            print(f"{work} is not empty and not a previous screenshots run: choose another --run-dir", file=sys.stderr)
            return 2
        shutil.rmtree(work)  # a fresh run each time (a kept one would resume: nothing to watch)
    work.mkdir(parents=True, exist_ok=True)
    convert(None, work / "tasks.parquet")
    rows = read_rows(work / "tasks.parquet")[:8]
    agents = AgentConfigs.load(REPO / "examples" / "agent_interaction" / "agent_config_local.yaml").override_all(
        {"concurrency": 6, "interaction": {"tools_in": "api", "constrain_tool_calls": False}})
    outcome: dict = {}

    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", resources={"SANDBOX": 64}) as cluster, \
            Client(cluster) as client, ScriptedLLM(make_policy(rows), delay_s=args.delay) as server:
        def job():
            try:
                outcome["run"] = run(rows, agents, client=client, engine="external", base_url=server.base_url,
                                     model_name="scripted-demo", agent_workers=2, n=3, output_dir=str(work / "run"),
                                     progress=False)
            except BaseException as exc:
                outcome["error"] = exc

        thread = threading.Thread(target=job, daemon=True)
        thread.start()
        base = client.dashboard_link.rsplit("/", 1)[0]
        token = client.run_on_scheduler(page_token)  # the pages need it: the run prints it in its links
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1050})
            page.set_default_timeout(180_000)
            page.goto(f"{base}/health?token={token}")  # leaves the cookie the page's requests carry
            page.evaluate("""async (url) => { for (let i = 0; i < 1800; i++) {
                try { if ((await fetch(url)).ok) return; } catch (e) {}
                await new Promise(r => setTimeout(r, 100)); } throw new Error("no page at " + url); }""",
                          base + "/uni-agent")
            page.goto(base + "/uni-agent?poll=500")
            page.wait_for_function("""() => { const n = id => +document.getElementById(id).textContent;
                const resolved = [...document.querySelectorAll("#recent td.num")].some(td => td.textContent === "1.00");
                return n('count-done') + n('count-failed') >= 9 && n('count-running') >= 3 && resolved; }""")
            page.screenshot(path=str(out_dir / "dashboard.png"))
            print(f"wrote {out_dir / 'dashboard.png'}")
            page.locator("#recent tr.rollout-row").filter(has_text="1.00").first.locator("a").click()
            page.wait_for_selector("#messages .msg")
            page.evaluate("() => document.getElementById('detail').scrollIntoView()")
            page.screenshot(path=str(out_dir / "dashboard-rollout.png"))
            print(f"wrote {out_dir / 'dashboard-rollout.png'}")
            thread.join(600)
            if "error" in outcome or thread.is_alive():
                print(f"the run failed: {outcome.get('error', 'still running')!r}", file=sys.stderr)
                return 1
            report = write_report(work / "run")
            page.set_viewport_size({"width": 1400, "height": 1750})
            page.goto(report.as_uri())
            page.screenshot(path=str(out_dir / "report.png"))
            print(f"wrote {out_dir / 'report.png'} (report: {report})")
            browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
