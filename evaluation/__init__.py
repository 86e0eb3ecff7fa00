"""pvpo.evaluation: `pvpo eval` - a policy (a local checkpoint or an OpenAI-compatible endpoint)
answers a dataset through the same agent loop and env as training; FlashRAG-layout predictions,
metrics, per-dataset tables and an optional LLM judge.

Exports load on first use, so `import pvpo.evaluation` imports no torch.
"""

from pvpo.lazy_exports import lazy_exports

_EXPORTS = {
    "run_eval": "run",
    "EvalSettings": "settings",
    "EvalError": "settings",
    "token_policy": "policies",
    "TokenPolicy": "policies",
    "OpenAIPolicy": "policies",
    "Judge": "judge",
    "judge_run": "judge",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
