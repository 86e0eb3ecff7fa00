"""Supervised warm start on oracle trajectories (the synthetic world's solved searches).

Each oracle trajectory is replayed through the vector env against the real retriever, so the
observations are exactly what the env would return; the policy is then trained by cross-entropy
on its own turns only (env tokens masked). A random tiny model needs this to
write any well-formed answer at all.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import torch

from pvpo.envs.data import QAExample
from pvpo.envs.episode import EpisodeConfig
from pvpo.envs.vector import info_at
from pvpo.progress import Progress
from pvpo.retriever.types import Searcher
from pvpo.trainer.rollout.agent_loop import prompt_ids, vector_env
from pvpo.trainer.rollout.trajectory import Trajectory, collate, response_logits


def oracle_trajectories(
    examples: Sequence[QAExample],
    oracle: Callable[[QAExample], list[str]],
    tokenizer: Any,
    searcher: Searcher,
    episode_config: EpisodeConfig,
    *,
    chat_template: bool = False,
    eos: bool = True,
) -> list[Trajectory]:
    """Replay `oracle(example)`'s turns through a `SearchVectorEnv` (one retriever call per turn
    for the batch), so the observations are exactly the env's; prompts are encoded as the agent
    loop encodes them. With `eos` the last turn is followed by EOS (SFT teaches the model to stop);
    without it the trajectory ends at the answer's stop string, as the agent loop's do. Each
    oracle token gets log-prob 0: the oracle is deterministic."""
    if not examples:
        return []
    turns = [oracle(ex) for ex in examples]
    env = vector_env(searcher, episode_config, len(examples))
    try:
        prompts, _ = env.reset(options={"questions": list(examples)})
        trajs = [Trajectory(ex.uid, prompt_ids(tokenizer, p, chat_template=chat_template))
                 for ex, p in zip(examples, prompts, strict=True)]  # fmt: skip
        for t in range(max(len(ts) for ts in turns)):
            # An oracle ends with its answer, so an episode still running has a turn left.
            live = [i for i, ts in enumerate(turns) if t < len(ts) and not env.done[i]]
            if not live:
                break
            actions = [""] * len(examples)  # finished episodes ignore theirs
            for i in live:
                actions[i] = turns[i][t]
                ids = list(tokenizer.encode(actions[i], add_special_tokens=False))
                trajs[i].append_model(ids, [0.0] * len(ids))
            obs, rewards, terminated, truncated, infos = env.step(actions)
            for i in live:
                trajs[i].num_turns += 1
                info = info_at(infos, i)
                trajs[i].num_tool_calls = int(info.get("num_searches", 0))
                if terminated[i] or truncated[i]:
                    trajs[i].reward = float(rewards[i])
                    trajs[i].accuracy = float(info.get("metrics", {}).get("em", 0.0))
                    trajs[i].prediction = info.get("prediction")
                    trajs[i].reward_components = dict(info.get("reward_components", {}))
                    trajs[i].finish_reason = "answer" if terminated[i] else "max_turns"
                    if eos:
                        trajs[i].append_model([tokenizer.eos_token_id], [0.0])
                else:
                    trajs[i].append_env(list(tokenizer.encode(obs[i], add_special_tokens=False)))
        return trajs
    finally:
        env.close()


def disjoint_splits(
    train: Sequence[QAExample],
    *,
    n_rl: int | None,
    n_sft: int | None,
    max_sft_hops: int | None = None,
    shuffle_seed: int | None = None,
) -> tuple[list[QAExample], list[QAExample]]:
    """(RL prompts, warm-start questions) from one train split, sharing no question.

    The split is shuffled with `shuffle_seed` (kept in order when None); the first `n_rl` are the
    RL prompts (all when None); the warm-start questions are the next `n_sft` of the rest with at
    most `max_sft_hops` hops (`metadata["hops"]`). With `n_sft` None there is no separate set and
    the warm start reuses the RL prompts."""
    items = list(train)
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(items)
    rl = items[:n_rl] if n_rl else items
    if n_sft is None:
        return rl, list(rl)
    rest = [ex for ex in items[len(rl) :] if max_sft_hops is None or ex.metadata.get("hops", 1) <= max_sft_hops]
    if len(rest) < n_sft:
        raise ValueError(
            f"asked for {n_sft} warm-start questions disjoint from {len(rl)} RL prompts, only {len(rest)} left"
        )
    return rl, rest[:n_sft]


def sft_loss(model: torch.nn.Module, trajs: Sequence[Trajectory], pad_id: int) -> torch.Tensor:
    """Mean negative log-likelihood of the model tokens (loss mask 1) of `trajs`."""
    from pvpo.trainer.algorithms.losses import aggregate, token_logprobs

    batch = collate(trajs, pad_id).to(next(model.parameters()).device)
    logp = token_logprobs(response_logits(model, batch), batch.response_ids)
    return -aggregate(logp, batch.loss_mask, "token-mean")


def warm_start(
    model: torch.nn.Module,
    trajs: Sequence[Trajectory],
    pad_id: int,
    *,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    show_progress: bool = True,
) -> list[float]:
    """`steps` AdamW steps of SFT on `trajs` (shuffled with `seed`); returns the loss per step."""
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, steps // 10)) * max(0.05, 1 - s / steps)
    )
    model.train()
    order: list[int] = []
    losses = []
    bar = Progress(range(steps), desc="warm start (oracle SFT)", unit="step", enabled=show_progress)
    for _ in bar:
        if len(order) < batch_size:
            fresh = list(range(len(trajs)))
            rng.shuffle(fresh)
            order += fresh
        idx, order = order[:batch_size], order[batch_size:]
        loss = sft_loss(model, [trajs[i] for i in idx], pad_id)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    return losses
