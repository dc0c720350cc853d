"""The driver's parts: what `uni_agent.runner.run` and `uni_agent.verify_run.verify_all` are built from.

    inputs      the one input loader of `run` and `verify`: agent configs, rows, specs, rejected rows
    cluster     the Dask client (a running scheduler, or a LocalCluster) and which workers take sandboxes
    pool        the AgentWorker actors, each with the worker the pool placed it on
    policy      the dispatch policy: events in (rollout done, call failed, workers gone), decisions out; no I/O
    dispatch    the loop that carries out the policy's decisions: actor calls, replacements, verification futures
    mailbox     rollouts to an actor in batches (two long-lived calls per actor, not one per rollout)
    progress    what a watcher sees: the terminal line and the events the dashboard page reads

Nothing is imported here, so that `from uni_agent.driver.policy import DispatchPolicy` loads no Dask.
"""
