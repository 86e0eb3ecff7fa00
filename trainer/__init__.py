"""pvpo.trainer: PVPO and its baselines over token-exact multi-turn search trajectories.

Sub-packages by job: `config` (typed config, presets), `rollout` (engines, the agent loop,
trajectories), `algorithms` (estimators, losses), `model` (policy, update, LoRA, warm start),
`parallel` (torchrun, FSDP2), `reference` (anchor, Group Sampling, GT), `state` (run dir,
checkpoints, metrics, episode log, cost, the run's result), `steps` (the step modes: synchronous
or pipelined, one step plan), `heldout` (the run's held-out evaluation); `loop.py` is the Trainer and its update, `data.py` and `setup.py` what a run
builds before its first step (its data, episode rules and loop limits; its policy, engine and
reference), `policy_engine.py` the rollout engine over the policy. The Trainer trains the policy it
is given: the base evaluation and the warm start run before it (`prepare_run`, which `train()`,
`pvpo train` and `pvpo demo` call). Evaluation of a checkpoint is
its own component, `pvpo.evaluation`; `pvpo demo` and the held-out tables are recipes around a
Trainer, `pvpo.recipes`.

Exports load on first use: `import pvpo.trainer.config` stays free of torch.
"""

from pvpo.lazy_exports import lazy_exports

_EXPORTS = {
    # configuration
    "TrainConfig": "config.schema",
    "ConfigError": "config.schema",
    "load_config": "config.schema",
    "dump_config": "config.written",
    "config_from_dict": "config.schema",
    # training: the stages before a Trainer (base evaluation, warm start), the Trainer, both in order
    "prepare_run": "setup",
    "RunStart": "setup",
    "Trainer": "loop",
    "TrainResult": "state.result",
    "train": "loop",
    # advantage estimators by name
    "register_estimator": "algorithms.spec",
    "get_estimator": "algorithms.spec",
    "get_spec": "algorithms.spec",
    "available_estimators": "algorithms.spec",
    # rollout engines by name
    "RolloutEngine": "rollout.engine",
    "SamplingConfig": "rollout.engine",
    "Completion": "rollout.engine",
    "register_engine": "rollout.engine",
    "build_engine": "rollout.engine",
    "available_engines": "rollout.engine",
    # trajectories, losses, the anchor
    "Trajectory": "rollout.trajectory",
    "LossConfig": "algorithms.losses",
    "total_loss": "algorithms.losses",
    "policy_loss": "algorithms.losses",
    "AnchorStore": "reference.anchor",
    "build_anchor": "reference.anchor",
    # policies
    "Policy": "model.policy",
    "load_policy": "model.policy",
    "save_policy": "model.policy",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
