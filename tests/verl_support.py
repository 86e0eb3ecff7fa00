"""What the verl adapter's tests share: whether verl itself is importable, the tiny chat tokenizer
the agent loop runs on, and the agent loop built from a config entry as verl builds it (the
`verl_api` fixture, in conftest.py, puts verl's modules or the stand-in in place)."""

from __future__ import annotations

import importlib
import importlib.util
from types import SimpleNamespace
from typing import Any

REAL_VERL = importlib.util.find_spec("verl") is not None
ADAPTERS = ("pvpo.integrations.verl.agent_loop", "pvpo.integrations.verl.search_tool", "pvpo.integrations.verl.plugin")


def chat_tokenizer() -> Any:
    """A tiny byte-level BPE with a ChatML-like template (the agent loop needs only these)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    corpus = [
        "Answer the question <search> capital of Germany </search> <information> Doc 1(Title: Berlin) "
        "Berlin is the capital of Germany </information> <answer> Berlin </answer> <think>"
    ]
    bpe.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    )
    return tok


def agent_loop(verl_api, tokenizer: Any, server: Any, entry: dict[str, Any], response_length: int = 256) -> Any:
    """The agent loop an agent-loop config entry describes, built as verl builds it."""
    config = {"actor_rollout_ref": {"rollout": {"prompt_length": 512, "response_length": response_length}}}
    data = {"apply_chat_template_kwargs": {}}
    if verl_api.real:
        import hydra
        from omegaconf import OmegaConf
        from verl.experimental.agent_loop.agent_loop import DictConfigWrap

        wrap = lambda d: DictConfigWrap(OmegaConf.create(d))  # noqa: E731
        return hydra.utils.instantiate(
            OmegaConf.create(entry),
            trainer_config=wrap(config),
            server_manager=server,
            tokenizer=tokenizer,
            processor=None,
            dataset_cls=None,
            data_config=wrap(data),
        )
    ns = lambda d: SimpleNamespace(**{k: ns(v) if isinstance(v, dict) else v for k, v in d.items()})  # noqa: E731
    module_name, _, cls_name = entry["_target_"].rpartition(".")
    cls = getattr(importlib.import_module(module_name), cls_name)
    kwargs = {k: v for k, v in entry.items() if k != "_target_"}
    return cls(
        trainer_config=SimpleNamespace(config=ns(config)),
        server_manager=server,
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=None,
        data_config=SimpleNamespace(config=data),
        **kwargs,
    )
