"""One episode: what runs inside an agent-worker actor, from a rollout spec to its result row.

    worker          the AgentWorker actor: many rollouts as async loops on its Dask worker's event loop
    envelope        one rollout around a strategy: begin, deadline, sandbox, endings, patch, close, redaction,
                    classification, masks (run_episode), the same for every agent
    strategy        the agent protocol: what a strategy gets (Episode: sandbox, model, budget) and returns (Ending)
    agent_loop      our own loop, a strategy (the seed's `uni_agent.agent_loop.UniAgentLoop` is an alias);
                    uni_agent.harness.HarnessAgent is the other; strategy_for: the one an agent config names
    conversation    the messages the model sees next turn, and what the row keeps
    trajectory      the rollout's training sequence, from the tokens each model call reported
    rollout         what crosses the actor boundary: RolloutSpec in, RolloutResult (a typed record; row() is its
                    Parquet row) out
    ending          how an episode ended, as a value (Ending) or an exception that carries one (EpisodeEnd)
    exit_reason     why an episode ended, one enum for rows, events and the dashboard
    failures        whose failure a finished rollout is (FailureKind, FailedPart), classified in one place

rollout, exit_reason and failures are also read by the driver, the reports and the dashboard: they describe what an
episode produces, so they live with the code that produces it. `uni_agent.current_worker` stays at the top level because engine actors
and events use it too, in every worker process. Nothing is imported here, so that `uni_agent.episode.exit_reason`
loads no sandbox, LLM client or Dask.
"""
