"""The uni-agent page and the run report in a real browser: headless Chromium (Debian's /usr/bin/chromium, driven by
Playwright) against a live run on a fresh real LocalCluster, with a ScriptedLLM that answers slowly enough for the
page to watch rollouts start, run and finish.

The pages need the scheduler's token (uni_agent.dashboard.guard): the browser opens the printed link once, and its
cookie then carries the page, its JSON, /metrics and Dask's bokeh /status page with its websocket; a browser without
it gets 403 everywhere.

The run: 3 bundled tasks x 2 rollouts, 2 at a time. Two tasks are solved (the gold patch, then submit: reward 1);
the third task's endpoint answers HTTP 403, so its rollouts fail with an LLMError.
"""

import json
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

import pandas as pd
import pytest
from playwright.sync_api import expect, sync_playwright

from conftest import AGENT_CONFIG
from test_dashboard_state import metric_deltas, metric_values
from uni_agent import AgentConfigs, run
from uni_agent.cli import main as cli_main
from uni_agent.dashboard import page_token
from uni_agent.driver.dataset import read_rows
from uni_agent.private_dirs import dask_dir
from uni_agent.tasks.swe_form import BUNDLED_DIR, convert
from uni_agent.testing.scripted_llm import Fault, ScriptedLLM, tool_call_message

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
DEADLINE_MS = 90_000


@pytest.fixture(scope="session")
def chromium():
    """Debian's Chromium; installed with apt-get when missing (Playwright's own browser download is not used)."""
    if not os.path.exists(CHROMIUM):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        apt = shutil.which("apt-get")
        if apt is None:
            pytest.fail(f"{CHROMIUM} is missing and there is no apt-get to install the chromium package")
        result = subprocess.run([apt, "install", "-y", "chromium"], env=env, capture_output=True, text=True,
                                timeout=1200)
        if result.returncode != 0:  # a fresh machine may need the package lists first
            subprocess.run([apt, "update"], env=env, capture_output=True, timeout=600)
            result = subprocess.run([apt, "install", "-y", "chromium"], env=env, capture_output=True, text=True,
                                    timeout=1200)
        if not os.path.exists(CHROMIUM):
            pytest.fail(f"apt-get install chromium failed (rc {result.returncode}): {result.stderr[-2000:]}")
    return CHROMIUM


@pytest.fixture(scope="module")
def browser(chromium):
    expect.set_options(timeout=DEADLINE_MS)  # expect()'s own default is 5 s: too short for rollouts to finish
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def fresh_cluster(tmp_path_factory):
    """A scheduler of its own: the run itself must install the page (no other test has registered it here)."""
    from distributed import Client, LocalCluster

    os.environ.setdefault("UNI_AGENT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", resources={"SANDBOX": 64},
                      local_directory=str(dask_dir())) as cluster, \
            Client(cluster) as client:
        yield client


def make_policy(rows):
    """Solve the first two tasks with their gold patch; refuse the third (HTTP 403 → LLMError → failed)."""
    instances = {r["instance_id"]: json.loads((BUNDLED_DIR / r["instance_id"] / "instance.json").read_text())
                 for r in rows}
    refused = rows[2]["instance_id"]

    def policy(body):
        user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        instance_id = next(i for i, inst in instances.items() if inst["problem_statement"].strip() in user)
        if instance_id == refused:
            return Fault(403, '{"error": {"message": "forbidden: scripted refusal"}}')
        turn = sum(m["role"] == "assistant" for m in body["messages"])
        if turn == 0:
            return tool_call_message("execute_bash", {"command": "git status --short && ls"})
        if turn == 1:
            patch = instances[instance_id]["patch"]
            return tool_call_message("execute_bash", {"command": f"cat > /tmp/fix.diff <<'EOF'\n{patch}EOF\n"
                                                                 "git apply /tmp/fix.diff && echo applied"})
        return tool_call_message("submit", {})

    return policy


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "bundled.parquet"
    convert(None, path)
    return read_rows(path)[:3]


class LiveRun:
    """The run in a thread (it blocks), so the browser can watch it from this one."""

    def __init__(self, rows, client, out: Path, server: ScriptedLLM):
        agents = AgentConfigs.load(AGENT_CONFIG).override_all(
            {"concurrency": 2, "interaction": {"tools_in": "api", "constrain_tool_calls": False}})
        self.out, self.outcome, self.error = out, None, None
        self.thread = threading.Thread(target=self._run, args=(rows, agents, client, server), daemon=True)

    def _run(self, rows, agents, client, server):
        try:
            self.outcome = run(rows, agents, client=client, engine="external", base_url=server.base_url,
                               model_name="scripted", agent_workers=2, n=2, output_dir=str(self.out), progress=False)
        except BaseException as exc:  # reported by the test
            self.error = exc

    def finish(self, timeout=300):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the run did not finish"
        if self.error is not None:
            raise self.error
        return self.outcome


def _wait_until_served(page, url, timeout_ms=DEADLINE_MS):
    """Poll the URL from the page (same origin) until it answers 200, within a deadline."""
    page.evaluate("""async ([url, ms]) => {
        const end = Date.now() + ms;
        while (Date.now() < end) {
            try { if ((await fetch(url, {cache: "no-store"})).ok) return; } catch (e) {}
            await new Promise(resolve => setTimeout(resolve, 100));
        }
        throw new Error(`${url} was not served within ${ms} ms`);
    }""", [url, timeout_ms])


def _int(page, selector):
    return int(page.locator(selector).inner_text())


def test_live_page_follows_a_run_and_the_report_shows_it(browser, fresh_cluster, rows, tmp_path, capfd):
    client = fresh_cluster
    base = client.dashboard_link.rsplit("/", 1)[0]
    token = client.run_on_scheduler(page_token)  # guards the pages now; the run prints this token in its links
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(DEADLINE_MS)
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    stranger = browser.new_context()  # another browser: no cookie, no token

    # Before the run, the scheduler has no uni-agent page. The first visit with the token leaves the cookie and
    # lands on the address without it.
    page.goto(f"{base}/health?token={token}")
    assert page.url == base + "/health" and page.inner_text("body").strip() == "ok"
    assert page.request.get(base + "/uni-agent").status == 404
    metrics_before = metric_values(page.request.get(base + "/metrics").text())

    with ScriptedLLM(make_policy(rows), delay_s=0.4) as server:
        live = LiveRun(rows, client, tmp_path / "out", server)
        live.thread.start()
        # The run registers the plugin: the page appears on the scheduler's own HTTP server.
        _wait_until_served(page, base + "/uni-agent")
        run_id = json.loads((tmp_path / "out" / "run.json").read_text())["run_id"]
        page.goto(base + "/uni-agent?poll=200")
        expect(page.locator("#run-id")).to_have_text(run_id)
        expect(page.locator("#count-total")).to_have_text("6")

        # Live: a rollout runs (turn k of max), then some rollouts have finished while others have not.
        expect(page.locator("#active tr[data-state='running']").first).to_contain_text(" / 6")
        page.wait_for_function(
            "() => { const n = +document.getElementById('count-done').textContent"
            " + +document.getElementById('count-failed').textContent; return n >= 1 && n < 6; }", polling=50)
        # The detail view of a rollout in flight follows it until it is finished, trajectory included.
        page.locator("#active a").first.click()
        expect(page.locator("#detail-title")).to_be_visible()
        expect(page.locator("#detail .pill").first).to_have_text(re.compile("^(done|failed)$"))
        expect(page.locator("#messages .msg").first).to_be_visible()
        page.evaluate("() => { location.hash = ''; }")
        expect(page.locator("#detail")).to_be_hidden()
        # ...and the page keeps up without a reload until every rollout is finished.
        page.wait_for_function(
            "() => +document.getElementById('count-done').textContent"
            " + +document.getElementById('count-failed').textContent === 6", polling=100)
        outcome = live.finish()
        # A browser without the token sees none of it, not even with the run's address.
        refused = {path: stranger.request.get(base + path).status for path in (
            "/uni-agent", f"/uni-agent/api/state.json?run={run_id}", "/metrics", "/status", "/json/identity.json")}
        assert set(refused.values()) == {403}, refused
        stranger.close()
    assert f"uni-agent page: {base}/uni-agent?token={token}\n" in capfd.readouterr().err  # the link the run printed

    # The page's numbers are the run's numbers.
    results = pd.read_parquet(tmp_path / "out" / "results")
    failed = int((results.exit_reason == "error").sum())
    assert failed == 2 and (results.reward[results.exit_reason != "error"] == 1.0).all()
    page.wait_for_function("() => document.getElementById('count-running').textContent === '0'")
    assert _int(page, "#count-done") == len(results) - failed and _int(page, "#count-failed") == failed
    for state in ("queued", "starting_sandbox", "running", "verifying"):
        assert _int(page, f"#count-{state}") == 0
    assert page.locator("#avg-reward").inner_text() == f"{outcome.summary['avg_at_n']:.3f}"
    expect(page.locator("#errors")).to_contain_text("LLMError")
    assert page.locator("#errors td.num").inner_text() == str(failed)
    assert page.locator("#workers tbody tr").count() == results.worker.nunique() == 2
    assert page.locator("#failures tbody tr.rollout-row").count() == failed
    started = results.sandbox_start_s[results.sandbox_start_s > 0].sort_values()
    assert f"n={len(started)}" in page.locator("#sandbox-p50-sub").inner_text() and len(started) == 6

    # The detail view shows a finished rollout's trajectory and its verification.
    solved = results[results.reward == 1.0].iloc[0]
    link = page.locator("#recent a", has_text=solved.instance_id).first
    link.click()
    detail = page.locator("#detail")
    expect(detail).to_be_visible()
    expect(page.locator("#detail-title")).to_contain_text(solved.instance_id)
    messages = json.loads(results[(results.instance_id == solved.instance_id)
                                  & (results.rollout == int(page.url.rsplit("/", 1)[1]))].messages.iloc[0])
    expect(page.locator("#messages .msg")).to_have_count(len(messages))
    expect(page.locator("#messages .msg.role-assistant").first).to_contain_text("tool call: execute_bash")
    expect(page.locator("#messages .msg.role-tool").nth(1)).to_contain_text("applied")
    expect(page.locator("#verification")).to_contain_text("resolved")
    expect(page.locator("#history")).to_contain_text("verifying")
    # A failed rollout's detail names its error.
    page.locator("#failures a").first.click()
    expect(page.locator("#detail")).to_contain_text("HTTP 403")

    # The same numbers on the scheduler's /metrics.
    expected = {'uni_agent_rollouts{state="failed"}': failed, 'uni_agent_rollouts{state="done"}': len(results) - failed,
                'uni_agent_rollout_errors_total{kind="LLMError"}': failed,
                "uni_agent_turns_total": int(results.num_turns.sum()),
                "uni_agent_rollouts_resolved_total": int(results.resolved.sum())}
    metrics_after = metric_values(page.request.get(base + "/metrics").text())
    assert metric_deltas(metrics_before, metrics_after, expected) == expected
    assert errors == [], errors

    # Dask's own /status page works with the cookie: bokeh's document arrives over its websocket.
    status = browser.new_page()
    status.goto(f"{base}/status?token={token}")
    status.wait_for_function("() => window.Bokeh && Bokeh.documents.length > 0"
                             " && Bokeh.documents[0].roots().length > 0", timeout=DEADLINE_MS)
    assert status.url == base + "/status"
    status.close()

    # The report, opened the same way.
    assert cli_main(["report", str(tmp_path / "out")]) == 0
    report = tmp_path / "out" / "report.html"
    page.goto(report.as_uri())
    expect(page.locator("#avg-at-n")).to_have_text(f"{outcome.summary['avg_at_n']:.3f}")
    expect(page.locator("#pass-at-2")).to_have_text(f"{outcome.summary['pass@2']:.3f}")
    assert page.locator("#task-table tbody tr").count() == 3
    assert page.locator("#task-table a.mark.ok").count() == len(results) - failed
    bars = page.locator("#turns-histogram rect.bar")
    counts = {int(b.get_attribute("data-turns")): int(b.get_attribute("data-count")) for b in bars.all()}
    assert counts == {k: int(v) for k, v in results.num_turns.value_counts().items()} | {
        k: 0 for k in range(int(results.num_turns.max()) + 1) if k not in set(results.num_turns)}
    expect(page.locator("#exit-table")).to_contain_text("error")
    # Every rollout's trajectory is in the file (6 < the default limit); only the failed ones show an error.
    assert page.locator("details.trajectory").count() == len(results)
    assert page.locator("details.trajectory p.error").count() == failed
    # Links to trajectories open them, in the same file.
    page.locator("#failing-table a").first.click()
    opened = page.locator("details.trajectory[open]")
    expect(opened).to_have_count(1)
    expect(opened).to_contain_text("HTTP 403")
    page.locator("#slowest-table a").first.click()
    target = page.locator("details.trajectory:target")
    expect(target).to_be_visible()
    expect(target.locator(".msg.role-assistant").first).to_contain_text("tool call")
    assert errors == [], errors


@pytest.mark.parametrize("separators", [(", ", ": "), (",", ":")], ids=["json-module", "compact (agent workers)"])
def test_detail_view_keeps_the_complete_messages_of_a_clipped_trajectory(browser, fresh_cluster, separators):
    """The driver cuts a long trajectory's JSON text at MAX_TRAJECTORY_CHARS, which leaves it unparseable: the
    detail view shows the messages that are complete and says the copy was clipped, whether the text was written by
    the json module or compact (orjson, as agent workers encode a conversation)."""
    from uni_agent.dashboard import UniAgentDashboard
    from uni_agent.events import MAX_TRAJECTORY_CHARS, TOPIC, rollout_event

    client = fresh_cluster
    client.register_plugin(UniAgentDashboard())  # a no-op when the first test's run registered it
    messages = [{"role": "user", "content": "fix the parser"}]
    while len(json.dumps(messages)) < MAX_TRAJECTORY_CHARS + 5000:
        messages.append({"role": "assistant", "content": "", "tool_calls": [{"id": f"c{len(messages)}",
                         "type": "function", "function": {"name": "execute_bash", "arguments": '{"command": "ls"}'}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{len(messages)}", "content": 'x}, {"y' * 400})
    text = json.dumps(messages, ensure_ascii=False, separators=separators)[:MAX_TRAJECTORY_CHARS]
    run_id = f"clipped-run-{len(separators[0])}"
    for state, fields in (("queued", {"max_turns": 99}), ("starting_sandbox", {"worker": "w"}),
                          ("done", {"reward": 0.0, "exit_reason": "max_turns", "num_turns": 99, "worker": "w",
                                    "messages": text, "verification": "{}"})):
        client.log_event(TOPIC, rollout_event(run_id, "big__task-1", 0, state, **fields))
    base = client.dashboard_link.rsplit("/", 1)[0]
    token = client.run_on_scheduler(page_token)
    page = browser.new_page()
    page.set_default_timeout(DEADLINE_MS)
    page.goto(f"{base}/uni-agent?token={token}&run={run_id}&poll=200#/rollout/{run_id}/big__task-1/0")
    assert page.url == f"{base}/uni-agent?run={run_id}&poll=200#/rollout/{run_id}/big__task-1/0"  # token gone
    expect(page.locator("#run-id")).to_have_text(run_id)
    expect(page.locator("#clipped-note")).to_contain_text("clipped")
    shown = page.locator("#messages .msg").count()
    complete = max(i for i in range(1, len(messages) + 1)
                   if len(json.dumps(messages[:i], separators=separators)) <= MAX_TRAJECTORY_CHARS)
    assert shown == complete
    expect(page.locator("#messages .msg.role-tool").first).to_contain_text('x}, {"y')
