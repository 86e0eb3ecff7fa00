"""The transformers rollout engine (`rollout.engine: hf`): batched sampling on CPU or one GPU.

Left-padded batches, KV cache, temperature / top-p, stop strings checked on the decoded tail of
each row, the repetition stop (`SamplingConfig.repetition_stop`), and the log-probability of every
sampled token under the temperature-scaled distribution (`log_softmax(logits / T)`, before top-p
truncation, as vLLM reports it). A turn ends at EOS and at the chat template's end-of-turn token
(`<|im_end|>` for ChatML models; see `stop_token_ids`). By default the engine samples from the
trainer's own module, so `sync_weights` costs nothing; beside the update (`share_weights=False`)
it samples from its own copy, whose weights `copy_dtype` may hold in 16 bits (`own_copy`). The
asynchronous agent loop runs it through a continuous-batching scheduler
(`pvpo.trainer.rollout.hf_scheduler`).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

import torch

from pvpo.trainer.rollout.cache_args import kv_cache_keyword, returned_kv_cache
from pvpo.trainer.rollout.engine import (
    AsyncGenerate,
    Completion,
    RolloutEngine,
    SamplingConfig,
    stop_token_ids,
)
from pvpo.trainer.rollout.repetition import ends_in_loop
from pvpo.trainer.rollout.sampling import last_logits_only, top_k_filter, top_p_filter

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def weight_dtype(name: str | torch.dtype) -> torch.dtype:
    """`name` ("bfloat16", "float32", ... or a torch dtype) as a floating torch dtype."""
    dtype = getattr(torch, name, None) if isinstance(name, str) else name
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"copy_dtype: {name!r} is not a floating dtype (float32, bfloat16, float16)")
    return dtype


def own_copy(model: torch.nn.Module, dtype: str | torch.dtype | None) -> torch.nn.Module:
    """A copy of `model` for the engine alone (rollouts beside the update, which writes `model`),
    its floating parameters in `dtype` (None: as they are). Only the parameters are cast: buffers
    such as the rotary `inv_freq` stay float32, as under the update's autocast, and tied weights
    stay tied (one parameter). The copy's KV cache takes the same dtype.

    SmolLM2-135M's copy in float32 (the master weights' dtype) holds 0.50 GiB and its KV cache
    45 KiB a cached token (30 layers x keys and values x 3 KV heads x 64 x 4 bytes: 2.7 GiB for the
    multi-hop recipe's 64 episodes in flight at 1,000 tokens); in bfloat16 0.25 GiB and 22.5 KiB
    (measured: parameter bytes and the cache's tensors after a 4 x 256-token prefill). Rejected:
    `copy.deepcopy` then a cast, which held a float32 transient of the whole model."""
    import copy

    target = None if dtype is None else weight_dtype(dtype)
    # Each parameter is cast as it is copied (deepcopy's memo), not after: no float32 transient of
    # the whole model, and the trainer's gradients, if any, stay behind.
    memo: dict[int, Any] = {}
    with torch.no_grad():
        for p in model.parameters():
            t = p.detach()
            cast = t.to(target) if target is not None and t.is_floating_point() else t
            if cast.data_ptr() == t.data_ptr():  # not cast (already `dtype`): copied as it is
                cast = t.clone()
            memo[id(p)] = torch.nn.Parameter(cast, requires_grad=p.requires_grad)
    return copy.deepcopy(model, memo)


class HFEngine(RolloutEngine):
    """Samples turns from a transformers causal LM."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        share_weights: bool = True,
        copy_dtype: str | torch.dtype | None = None,
        micro_batch_size: int = 64,
        device: str | torch.device | None = None,
    ) -> None:
        """`share_weights`: sample from `model` itself, else from a copy (`own_copy`) whose weights
        are `copy_dtype` (None: the model's own; ignored when sharing)."""
        self.tokenizer = tokenizer
        self.model = model if share_weights else own_copy(model, copy_dtype)
        self.device = torch.device(device) if device is not None else next(self.model.parameters()).device
        self.micro_batch_size = micro_batch_size
        self.eos_id = tokenizer.eos_token_id
        self.stop_ids = stop_token_ids(tokenizer, self.model)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id

    def sync_weights(self, model: torch.nn.Module) -> None:
        """No-op when sharing the trainer's module; otherwise copy its parameters in place (cast to
        the copy's dtype)."""
        if model is self.model:
            return
        with torch.no_grad():
            self.model.load_state_dict(model.state_dict())

    def async_session(self, executor: Executor) -> AsyncGenerate:
        """A continuous-batching scheduler (at most `micro_batch_size` rows at once)."""
        from pvpo.trainer.rollout.hf_scheduler import ContinuousBatcher

        return ContinuousBatcher(self, executor, self.micro_batch_size).session()

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig) -> list[Completion]:
        gen = torch.Generator(device="cpu")
        gen.manual_seed(sampling.seed if sampling.seed is not None else torch.seed() % (2**63))
        out: list[Completion] = []
        for start in range(0, len(prompts), self.micro_batch_size):
            out.extend(self._generate_batch(prompts[start : start + self.micro_batch_size], sampling, gen))
        return out

    def _decode_tail(self, ids: list[int], n_chars: int) -> str:
        # Enough trailing tokens to contain any stop string (each token decodes to >= 1 char,
        # except partial bytes, hence the margin).
        return str(self.tokenizer.decode(ids[-(n_chars + 4) :], skip_special_tokens=False))

    @torch.no_grad()
    def _generate_batch(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig, gen: torch.Generator
    ) -> list[Completion]:
        model = self.model
        was_training = model.training
        model.eval()
        try:
            return self._sample(model, prompts, sampling, gen)
        finally:
            model.train(was_training)

    def _sample(
        self, model: torch.nn.Module, prompts: Sequence[Sequence[int]], sampling: SamplingConfig, gen: torch.Generator
    ) -> list[Completion]:
        b = len(prompts)
        width = max(len(p) for p in prompts)
        input_ids = torch.full((b, width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((b, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            if len(p):
                input_ids[i, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
                attn[i, width - len(p) :] = 1
        input_ids, attn = input_ids.to(self.device), attn.to(self.device)
        positions = (attn.cumsum(-1) - 1).clamp(min=0)
        max_stop = max((len(s) for s in sampling.stop), default=0)

        tokens: list[list[int]] = [[] for _ in range(b)]
        logps: list[list[float]] = [[] for _ in range(b)]
        finish: list[str | None] = [None] * b
        stop_hit: list[str | None] = [None] * b
        past = None
        step_ids, step_pos = input_ids, positions
        last_only = last_logits_only(model)
        kv = kv_cache_keyword(model)
        for _ in range(sampling.max_new_tokens):
            res = model(
                input_ids=step_ids,
                attention_mask=attn,
                position_ids=step_pos,
                use_cache=True,
                **{kv: past},
                **last_only,
            )
            past = returned_kv_cache(res)
            greedy = sampling.temperature <= 0  # temperature 0: argmax, log-probs at T = 1
            logits = res.logits[:, -1, :].float() / (1.0 if greedy else sampling.temperature)
            # selective log-softmax: logsumexp [b] once, no second [b, V] log-softmax tensor
            log_norm = torch.logsumexp(logits, dim=-1)
            if greedy:
                nxt = logits.argmax(dim=-1).cpu()
            else:
                filtered = top_p_filter(top_k_filter(logits, sampling.top_k), sampling.top_p)
                probs = torch.softmax(filtered, dim=-1).cpu()
                nxt = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
            chosen_logp = (logits.gather(-1, nxt[:, None].to(logits.device)).squeeze(-1) - log_norm).cpu()
            for i in range(b):
                if finish[i] is not None:
                    continue
                t = int(nxt[i])
                tokens[i].append(t)
                logps[i].append(float(chosen_logp[i]))
                self.sampled_tokens += 1
                if t in self.stop_ids:
                    finish[i] = "eos"
                elif max_stop:
                    tail = self._decode_tail(tokens[i], max_stop)
                    for s in sampling.stop:
                        if s in tail:
                            finish[i], stop_hit[i] = "stop", s
                            break
                if finish[i] is None and ends_in_loop(tokens[i], sampling.repetition_stop):
                    finish[i] = "repetition"
            if all(f is not None for f in finish):
                break
            fed = torch.tensor(
                [t[-1] if f is None else self.pad_id for t, f in zip(tokens, finish, strict=True)], dtype=torch.long
            )
            step_ids = fed[:, None].to(self.device)
            step_pos = step_pos[:, -1:] + 1
            attn = torch.cat([attn, torch.ones((b, 1), dtype=attn.dtype, device=self.device)], dim=1)
        return [
            Completion(
                token_ids=tokens[i],
                logprobs=logps[i],
                finish_reason=finish[i] or "length",
                stop_string=stop_hit[i],
                text=str(self.tokenizer.decode(tokens[i], skip_special_tokens=False)),
            )
            for i in range(b)
        ]
