"""Micro-batches by token budget, and gradient accumulation that equals one big batch.

Long multi-turn trajectories make row counts a poor memory bound: one micro-batch of 8 rows of
4k tokens holds 16x the activations of 8 rows of 256. `plan_micro_batches` packs the rows of a
mini-batch (longest first) so each micro-batch's padded size, rows x (longest prompt + longest
response) after trimming the all-padding columns, stays within `optim.max_tokens_per_micro_batch`
(a row longer than the budget goes alone). verl's dynamic batch size (`use_dynamic_bsz`,
`ppo_max_token_len_per_gpu`) is the same idea.

Each micro-batch's loss is weighted by its share of the mini-batch's aggregation units (model
tokens for `token-mean`, rows with a model token for `seq-mean-token-mean`, rows for
`seq-mean-token-sum-norm` with its constant divisor), counted over all data-parallel ranks, so
the accumulated gradient is the gradient of the loss over the whole mini-batch: independent of how
it is cut into micro-batches and over how many ranks (rejected: the mean of micro-batch means,
which over-weights the tokens of short micro-batches). Under FSDP every rank must run the same
number of forwards, so plans are padded to the largest count over ranks, with zero-weight
micro-batches where a rank has run out of rows.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import torch

from pvpo.trainer.algorithms.spec import check_aggregation
from pvpo.trainer.parallel.distributed import all_reduce_max, all_reduce_sum, world_size
from pvpo.trainer.rollout.trajectory import Batch


def row_lengths(batch: Batch) -> tuple[list[int], list[int]]:
    """(prompt tokens, response tokens) of each row, padding excluded."""
    p = batch.attention_mask[:, : batch.prompt_len].sum(-1)
    r = batch.attention_mask[:, batch.prompt_len :].sum(-1)
    return [int(x) for x in p], [int(x) for x in r]


def padded_tokens(rows: Sequence[int], prompt_lens: Sequence[int], response_lens: Sequence[int]) -> int:
    """Tokens a micro-batch of `rows` computes once its all-padding columns are trimmed."""
    if not rows:
        return 0
    return len(rows) * (max(prompt_lens[i] for i in rows) + max(response_lens[i] for i in rows))


def plan_micro_batches(
    rows: Sequence[int],
    prompt_lens: Sequence[int],
    response_lens: Sequence[int],
    *,
    max_tokens: int | None = None,
    max_rows: int | None = None,
    parts: int = 1,
    min_count: int = 1,
) -> list[list[int]]:
    """Cut `rows` (indices into the length lists) into micro-batches.

    With `max_tokens`, rows are packed longest first while the padded size stays within it (and
    within `max_rows`); without it, `rows` are cut in order into `parts` near-equal pieces (then by
    `max_rows`). The plan is then split further (largest padded size first) up to `min_count`
    micro-batches; where rows run out it is completed with empty micro-batches."""
    rows = list(rows)
    plan: list[list[int]] = []
    if max_tokens is not None:
        order = sorted(rows, key=lambda i: (-(prompt_lens[i] + response_lens[i]), i))
        cur: list[int] = []
        for i in order:
            cand = cur + [i]
            if cur and (
                padded_tokens(cand, prompt_lens, response_lens) > max_tokens or (max_rows and len(cand) > max_rows)
            ):
                plan.append(cur)
                cand = [i]
            cur = cand
        if cur:
            plan.append(cur)
    else:
        chunks = [
            c.tolist()
            for c in torch.tensor_split(torch.tensor(rows, dtype=torch.long), min(max(parts, 1), max(len(rows), 1)))
        ]
        for c in (c for c in chunks if c):
            step = max_rows or len(c)
            plan += [c[s : s + step] for s in range(0, len(c), step)]
    while len(plan) < min_count:
        splittable = [m for m in plan if len(m) > 1]
        if not splittable:
            plan += [[] for _ in range(min_count - len(plan))]
            break
        big = max(splittable, key=lambda m: padded_tokens(m, prompt_lens, response_lens))
        k = plan.index(big)
        plan[k : k + 1] = [big[: len(big) // 2], big[len(big) // 2 :]]
    return plan


def trim_columns(batch: Batch) -> tuple[Batch, int]:
    """`batch` without its all-padding columns (leading prompt, trailing response); returns the
    trimmed batch and the number of response columns kept (per-token tensors keep `[:, :r]`)."""
    attn = batch.attention_mask
    used = attn.any(dim=0)
    prompt_used = used[: batch.prompt_len]
    first = int(prompt_used.nonzero()[0]) if bool(prompt_used.any()) else batch.prompt_len
    if first == batch.prompt_len:
        first = batch.prompt_len - 1  # keep one prompt column: it predicts the first response token
    resp_used = used[batch.prompt_len :]
    r = int(resp_used.nonzero()[-1]) + 1 if bool(resp_used.any()) else 1
    end = batch.prompt_len + r
    trimmed = Batch(
        batch.input_ids[:, first:end],
        attn[:, first:end],
        batch.position_ids[:, first:end],
        batch.response_ids[:, :r],
        batch.loss_mask[:, :r],
        batch.old_logprobs[:, :r],
        batch.rewards,
        batch.uids,
        batch.is_gt,
        batch.prompt_len - first,
    )
    return trimmed, r


def loss_units(loss_mask: torch.Tensor, agg: str) -> float:
    """How much a set of rows weighs in aggregation mode `agg` (see the module docstring)."""
    if check_aggregation(agg) == "token-mean":
        return float(loss_mask.sum())
    if agg == "seq-mean-token-mean":
        return float((loss_mask.sum(-1) > 0).sum())
    return float(loss_mask.shape[0])  # seq-mean-token-sum-norm: every row, over a constant length


@dataclass
class MicroBatch:
    """One micro-batch: its rows (indices into the full batch), trimmed tensors, the response
    columns kept, and the weight of its loss in the mini-batch's gradient (0 for padding)."""

    rows: list[int]
    batch: Batch
    r: int
    weight: float


def micro_batches(
    batch: Batch,
    rows: Sequence[int],
    *,
    agg: str,
    max_tokens: int | None,
    parts: int = 1,
    max_rows: int | None = None,
    skip: Collection[int] = (),
) -> list[MicroBatch]:
    """The micro-batches of the mini-batch `rows` of `batch`, weighted for an exact accumulation
    over all ranks (a collective: every data-parallel rank must call it for each mini-batch).
    Rows in `skip` (whose loss is known to be 0) get no micro-batch but still count in the
    aggregation's denominator, so the others weigh what they would with them."""
    pl, rl = row_lengths(batch)
    run = [r for r in rows if r not in skip]
    plan = plan_micro_batches(run, pl, rl, max_tokens=max_tokens, max_rows=max_rows, parts=parts)
    count = all_reduce_max(len(plan))
    if count > len(plan):
        plan = plan_micro_batches(run, pl, rl, max_tokens=max_tokens, max_rows=max_rows, parts=parts, min_count=count)
    total = all_reduce_sum(loss_units(batch.loss_mask[list(rows)], agg)) if rows else all_reduce_sum(0.0)
    out = []
    for micro in plan:
        # a rank short of rows still runs a forward/backward (FSDP's collectives), weighted 0
        pick = micro or [int(rows[0]) if len(rows) else 0]
        sub, r = trim_columns(batch.select(pick))
        weight = loss_units(sub.loss_mask, agg) / total * world_size() if micro and total > 0 else 0.0
        out.append(MicroBatch(pick, sub, r, weight))
    return out


def accumulate(
    micros: Sequence[MicroBatch], loss_fn: Callable[[MicroBatch], tuple[torch.Tensor, dict[str, float]]]
) -> tuple[float, list[dict[str, float]]]:
    """Backward of each micro-batch's weighted loss; returns the mini-batch's loss over all ranks
    (what one pass over the whole mini-batch would give) and the stats of the non-empty ones."""
    loss_sum, stats = 0.0, []
    for mb in micros:
        loss, s = loss_fn(mb)
        (loss * mb.weight).backward()
        if mb.weight > 0:
            loss_sum += float(loss.detach()) * mb.weight
            stats.append(s)
    return all_reduce_sum(loss_sum) / world_size(), stats


@torch.no_grad()
def batch_forward(
    batch: Batch, fn: Callable[[Batch], torch.Tensor], *, max_tokens: int | None, max_rows: int
) -> torch.Tensor:
    """`fn` (per-token `[b, r]` values, e.g. log-probs) over all rows of `batch` in micro-batches,
    reassembled in row order as `[B, R]` (zeros beyond each micro-batch's kept columns). The
    same number of forwards runs on every rank."""
    pl, rl = row_lengths(batch)
    rows = list(range(len(batch)))
    plan = plan_micro_batches(rows, pl, rl, max_tokens=max_tokens, max_rows=max_rows, parts=1)
    count = all_reduce_max(len(plan))
    if count > len(plan):
        plan = plan_micro_batches(rows, pl, rl, max_tokens=max_tokens, max_rows=max_rows, min_count=count)
    out = torch.zeros(batch.response_ids.shape, dtype=torch.float32, device=batch.response_ids.device)
    for micro in plan:
        sub, r = trim_columns(batch.select(micro or [0]))
        values = fn(sub)
        if micro:
            out[torch.as_tensor(micro, device=out.device), :r] = values.float()
    return out
