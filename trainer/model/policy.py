"""The policy: a Hugging Face causal LM loaded from a path, or a tiny Qwen2 built locally.

The tiny policy's tokenizer is a byte-level BPE trained with `tokenizers` on the text it will see
(so every string is encodable and decoding is exact), with the protocol's tags as whole tokens
and `<|endoftext|>` as both EOS and pad. Nothing is downloaded; `save_pretrained` writes a
directory that `from_pretrained` (and vLLM, Qwen2 architecture) load.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from pvpo.trainer.config.policy import ModelConfig, TinyModelConfig

M = TypeVar("M", bound="torch.nn.Module")

EOS_TOKEN = "<|endoftext|>"


@dataclass
class Policy:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase


def tag_tokens(protocol_tags: Iterable[str]) -> list[str]:
    """Opening and closing forms of each tag, e.g. `<search>`, `</search>`."""
    return [t for tag in protocol_tags for t in (f"<{tag}>", f"</{tag}>")]


def train_tokenizer(
    texts: Iterable[str], *, vocab_size: int = 1024, extra_tokens: Sequence[str] = ()
) -> PreTrainedTokenizerBase:
    """A byte-level BPE tokenizer trained on `texts`, wrapped as PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    # Tags become single tokens so a stop string always ends exactly at a token boundary.
    tok.add_tokens(list(extra_tokens))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN)
    fast.padding_side = "left"
    return fast


def build_tiny_model(tokenizer: PreTrainedTokenizerBase, cfg: TinyModelConfig, *, seed: int = 0) -> PreTrainedModel:
    """A randomly initialised Qwen2 causal LM sized by `cfg`, with the tokenizer's vocabulary."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config.dtype = torch.float32  # transformers 5's name (torch_dtype in 4.x, which still reads it)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = Qwen2ForCausalLM(config)
    finally:
        torch.random.set_rng_state(state)
    return model


def build_tiny_policy(texts: Iterable[str], cfg: TinyModelConfig, *, tags: Iterable[str], seed: int = 0) -> Policy:
    """Tokenizer trained on `texts` + a tiny Qwen2 sized by `cfg`."""
    tokenizer = train_tokenizer(texts, vocab_size=cfg.vocab_size, extra_tokens=tag_tokens(tags))
    return Policy(build_tiny_model(tokenizer, cfg, seed=seed), tokenizer)


# What a Hugging Face model folder holds: one of each (sharded weights come with their index).
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "adapter_model.safetensors",
    "adapter_model.bin",
)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
)


class ModelFolderError(ValueError):
    """A local model folder that cannot load: the message names the folder, what it lacks and
    what to do (a ValueError: `pvpo`'s one-line error, rc 2)."""


def check_model_folder(path: str | Path) -> None:
    """Refuse a local model folder that lacks its config, weights or tokenizer (ModelFolderError
    naming what is missing), before transformers reports a consequence instead (an "empty
    prompt" for a missing tokenizer, a missing sentencepiece for an empty folder). A path that is
    not a local folder (a hub id) is left to transformers."""
    path = Path(path)
    if not path.is_dir():
        return
    names = {p.name for p in path.iterdir()}
    where = f"model folder {path}"
    if not names:
        raise ModelFolderError(
            f"{where} is empty: give a Hugging Face model folder (config.json, weights, tokenizer), "
            "a catalog name (`pvpo models list`) or a *.gguf file"
        )
    if "config.json" not in names:
        inside = " (a checkpoint's model is its policy/ folder)" if (path / "policy" / "config.json").exists() else ""
        raise ModelFolderError(f"{where} has no config.json: it is not a Hugging Face model folder{inside}")
    if not names & set(WEIGHT_FILES):
        raise ModelFolderError(
            f"{where} has no weights (none of {', '.join(WEIGHT_FILES[:3])}, ...): copy them into it, or give the "
            "folder that holds them"
        )
    if not names & set(TOKENIZER_FILES) and not any(n.endswith(".tiktoken") for n in names):
        raise ModelFolderError(
            f"{where} has no tokenizer (none of {', '.join(TOKENIZER_FILES[:4])}, ...): copy the tokenizer files of "
            "the model it was trained from into it"
        )


def damaged_model_file(
    path: Path,
    err: Exception,
    files: Sequence[str],
    fix: str = "copy the model again (or re-download it), or give another folder",
) -> Exception:
    """A model file transformers could not read (truncated, corrupted: safetensors' or torch's zip
    reader, a JSON parser, or `tokenizers`, which raises a bare Exception) as a DamagedFileError
    naming the first of `files` in the folder `path`, and `fix`; `err` itself when it is not that
    (a full disk, an unknown architecture, ...)."""
    import json

    from safetensors import SafetensorError

    from pvpo.atomic import DamagedFileError

    unreadable = (
        isinstance(err, SafetensorError | json.JSONDecodeError)
        or type(err) is Exception
        or (isinstance(err, RuntimeError | OSError) and not getattr(err, "errno", None) and "zip" in str(err).lower())
    )
    if not unreadable or not path.is_dir():
        return err
    file = next((path / n for n in files if (path / n).exists()), path)
    cause = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return DamagedFileError(file, cause, fix)


def load_policy(path: str | Path, *, dtype: str = "float32") -> Policy:
    """A causal LM and its tokenizer from a local directory, hub id, catalog name or `*.gguf` file
    (`pvpo.model_catalog.resolve_model_path`), with left padding and a pad token. A local folder
    without config, weights or tokenizer, or with damaged weights, is refused naming the file."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pvpo.model_catalog import resolve_model_path

    path = resolve_model_path(str(path))
    check_model_folder(path)
    try:  # re-raised as it was unless a file is damaged
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except Exception as err:
        raise damaged_model_file(
            Path(path), err, ("tokenizer.json", "tokenizer_config.json", *TOKENIZER_FILES)
        ) from err
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype))
    except Exception as err:
        raise damaged_model_file(Path(path), err, WEIGHT_FILES) from err
    return Policy(model, tokenizer)


def save_policy(policy: Policy, path: str | Path) -> None:
    """`save_pretrained` of model and tokenizer into one directory."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    policy.model.save_pretrained(path)
    policy.tokenizer.save_pretrained(path)


def frozen_copy(model: M) -> M:
    """A deep copy with gradients off, in eval mode (the reference policy)."""
    import copy

    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def policy_from_config(cfg: ModelConfig, *, corpus_texts: Iterable[str], tags: Iterable[str], seed: int) -> Policy:
    """`cfg.path` when set, else a tiny policy whose tokenizer is trained on `corpus_texts`.

    Loaded in float32 whatever `cfg.dtype` says: these are the trained master weights, and loading
    through bf16 first would round a float32 checkpoint once for good (`cfg.dtype` is the compute
    dtype, applied by autocast; the frozen reference is cast to it by `place_reference_model`)."""
    if cfg.path:
        return load_policy(cfg.path, dtype="float32")
    return build_tiny_policy(corpus_texts, cfg.tiny, tags=tags, seed=seed)
