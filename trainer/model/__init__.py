"""The trained model: policy loading, placement and precision, LoRA, micro-batching, the policy
update and the supervised warm start."""
