"""The driver: the Python API of a run and the parts it, the rollout service and verification are built from.

    run         `run`/`run_async`: rows in, results out (`from uni_agent import run`)
    session     one run session: cluster, live page, engines, agent workers, dispatcher, assembled in one place
    interrupt   how a run stops on Ctrl-C, SIGTERM, SIGHUP, SIGUSR1: finished rows flushed, one line, exit 128+signal
    inputs      the one input loader of `run` and `verify`: agent configs, rows, specs, rejected rows
    cluster     the Dask client (a running scheduler, or a LocalCluster) and which workers take sandboxes
    pool        the AgentWorker actors, each with the worker the pool placed it on
    policy      the dispatch policy: events in (rollout done, call failed, workers gone), decisions out; no I/O
    dispatch    the loop that carries out the policy's decisions: actor calls, replacements, verification futures
    mailbox     rollouts to an actor in batches (two long-lived calls per actor, not one per rollout)
    progress    what a watcher sees: the terminal line and the events the dashboard page reads
    dataset     reading dataset rows (the seed schema) into rollout specs, with errors that name the row
    results     the Parquet results on disk, appended as rollouts finish; a rerun resumes from them
    summary     summary.json: Avg@N, pass@k, exit reasons, failure kinds, throughput
    manifest    run.json: what produced a run (settings, agent configs, inputs, versions)
    verify      `uni-agent verify`: grade each task's gold or empty answer, in parallel as Dask futures
    spill       where finished results wait when the output dir cannot take them
    tls         the cluster's credentials: temporary for a LocalCluster, files for a cluster started apart
    worker_watch   a call to a dead worker's actor ends, never hangs

Nothing is imported here, so that `from uni_agent.driver.policy import DispatchPolicy` loads no Dask.
"""
