"""What a trainer takes from finished rollouts: functions over result rows (the Parquet rows, or RolloutResults), with
no trainer imported. `formats` holds verl's agent-loop output and a plain padded batch."""
