"""One episode: what runs inside an agent-worker actor, from a rollout spec to its result row.

    worker          the AgentWorker actor: many rollouts as async loops on its Dask worker's event loop
    agent_loop      one rollout, sandbox start to patch (the seed's `uni_agent.agent_loop.UniAgentLoop` is an alias)
    conversation    the messages the model sees next turn, and what the row keeps
    trajectory      the rollout's training sequence, from the tokens each model call reported
    rollout         what crosses the actor boundary: RolloutSpec in, RolloutResult (one Parquet row) out
    exit_reason     why an episode ended, one enum for rows, events and the dashboard
    failures        whose failure a finished rollout is (none, model, infra)

The last three are also read by the driver, the reports and the dashboard: they describe what an episode produces, so
they live with the code that produces it. `uni_agent.current_worker` stays at the top level because engine actors
and events use it too, in every worker process. Nothing is imported here, so that `uni_agent.episode.exit_reason`
loads no sandbox, LLM client or Dask.
"""
