"""Data-parallel training under torchrun: torch.distributed primitives, FSDP2 sharding and
sharded checkpoints (DCP)."""
