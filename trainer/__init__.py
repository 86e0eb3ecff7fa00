"""pvpo.trainer: typed config, rollout engines, the token-exact agent loop, advantage estimators,
losses, the PVPO anchor and Group Sampling, the training loop, the demo and evaluation.

Exports load on first use: `import pvpo.trainer.config` stays free of torch.
"""

from pvpo.lazy_exports import lazy_exports

_EXPORTS = {
    # configuration
    "TrainConfig": "config",
    "ConfigError": "config",
    "load_config": "config",
    "dump_config": "config",
    "config_from_dict": "config",
    # training and the demo
    # (the functions `train` and `evaluate` share their modules' names: pvpo.trainer.train.train)
    "Trainer": "train",
    "TrainResult": "train",
    "run_demo": "demo",
    # advantage estimators by name
    "register_estimator": "advantages",
    "get_estimator": "advantages",
    "available_estimators": "advantages",
    # rollout engines by name
    "RolloutEngine": "engine",
    "SamplingConfig": "engine",
    "Completion": "engine",
    "register_engine": "engine",
    "build_engine": "engine",
    "available_engines": "engine",
    # trajectories, losses, the anchor
    "Trajectory": "trajectory",
    "LossConfig": "losses",
    "total_loss": "losses",
    "policy_loss": "losses",
    "AnchorStore": "anchor",
    "build_anchor": "anchor",
    # policies
    "Policy": "policy",
    "load_policy": "policy",
    "save_policy": "policy",
    # evaluation
    "run_eval": "eval_run",
    "EvalSettings": "eval_run",
    "token_policy": "eval_run",
    "Judge": "judge",
    "judge_run": "judge",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
