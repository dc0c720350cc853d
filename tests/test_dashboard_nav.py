"""Dask's own dashboard (bokeh, pinned in pyproject.toml) and the uni-agent page share one address: /status serves
the task stream and workers, its navigation bar links the uni-agent page, and the page links back. Both behind the
scheduler's token, installed with the page: the first visit with ?token= leaves a cookie that opens both."""

import asyncio

import httpx
import pytest


def test_dask_status_page_links_the_uni_agent_page():
    pytest.importorskip("bokeh", reason="bokeh is a pinned dependency: pip install -e .")
    from distributed import Client, LocalCluster

    from uni_agent.dashboard import page_token
    from uni_agent.dashboard.plugin import UniAgentDashboard

    async def scenario():
        async with LocalCluster(n_workers=1, processes=False, asynchronous=True,
                                dashboard_address="127.0.0.1:0") as cluster, \
                Client(cluster, asynchronous=True) as client:
            await client.register_plugin(UniAgentDashboard())
            token = await client.run_on_scheduler(page_token)
            base = f"http://127.0.0.1:{cluster.scheduler.http_server.port}"  # loopback, whatever the link names
            async with httpx.AsyncClient(timeout=30) as stranger:
                refused = [(await stranger.get(f"{base}{path}")).status_code for path in ("/status", "/uni-agent")]
            async with httpx.AsyncClient(timeout=30, follow_redirects=True) as http:
                status = await http.get(f"{base}/status?token={token}")  # sets the cookie, then /status
                page = await http.get(f"{base}/uni-agent")  # the cookie alone
            return refused, status, page

    refused, status, page = asyncio.run(scenario())
    assert refused == [403, 403]
    assert status.status_code == 200 and str(status.url).endswith("/status"), (status.status_code, status.url)
    assert "Task Stream" in status.text or "task-stream" in status.text.lower()  # Dask's bokeh page, not a stub
    assert 'href="uni-agent"' in status.text  # the navigation bar's link
    assert page.status_code == 200 and 'href="status"' in page.text
