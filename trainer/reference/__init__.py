"""PVPO's reference machinery: the static anchor, Group Sampling and ground-truth trajectories."""
