"""Advantage estimators (each registers one spec of what it needs), the losses and the
sampler/trainer importance correction. Imports nothing of the trainer but `rollout.trajectory`."""
