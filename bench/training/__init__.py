"""Training and rollouts: the update step, its memory, rollout engines, rollouts beside the update."""
