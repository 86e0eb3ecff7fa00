"""What a run directory holds: its files (named once, in `run_dir`), checkpoints, the metrics log
and the rollout-cost counters."""
