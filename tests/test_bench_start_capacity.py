"""`python -m uni_agent.bench.start_capacity`: a wave of local sandboxes across several fork servers, timed."""

from __future__ import annotations

import os

import pytest

from uni_agent.bench import start_capacity
from uni_agent.sandbox import fork_server


def test_a_wave_across_two_fork_servers_counts_every_start():
    figures = start_capacity.start_capacity(2, 8)
    assert figures["sandboxes"] == 8  # 4 in each process
    assert 0 < figures["p50_ms"] <= figures["p95_ms"] <= 1000 * figures["ready_s"]
    assert figures["per_s"] == pytest.approx(8 / figures["ready_s"])


def test_the_experiment_takes_only_the_network_namespace_out_of_a_sandboxs_start(monkeypatch):
    source = fork_server.FORK_SERVER_SOURCE
    monkeypatch.setattr(fork_server, "FORK_SERVER_SOURCE", source)  # restored after the test
    start_capacity._without_network_namespace()
    changed = fork_server.FORK_SERVER_SOURCE
    unshare = next(line for line in changed.splitlines() if "libc.unshare(CLONE_NEWNS" in line)
    assert "CLONE_NEWNET" not in unshare and "CLONE_NEWPID" in unshare
    assert "    _loopback_up()\n" not in changed and "    _loopback_up()\n" in source
    assert len(source) - len(changed) == len("| CLONE_NEWNET ") + len("    _loopback_up()\n")


def test_bad_counts_are_refused_naming_the_value(capsys):
    with pytest.raises(SystemExit) as exit_:
        start_capacity.main(["--fork-servers", "1,0"])
    assert exit_.value.code == 2 and "'1,0'" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() != 0, reason="unshare(2) of a network namespace needs root here")
def test_the_kernel_rate_is_measured_for_each_process():
    rate = start_capacity.kernel_rate(start_capacity.NAMESPACES["network"], 2, count=5)
    assert rate is not None and rate > 0
