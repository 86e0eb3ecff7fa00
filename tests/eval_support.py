"""Test helpers for the evaluation path: a tiny policy that has learned to search and answer."""

from __future__ import annotations

from pathlib import Path

SEARCH_TURN = "<think> look it up </think><search> capital of Germany </search>"
ANSWER_TURN = "<think> found </think><answer> Berlin </answer>"


def searching_policy(out: Path, questions: list[str], *, steps: int = 80, seed: int = 0) -> Path:
    """A tiny Qwen2 (hidden 64, head_dim 32 so vLLM's CPU attention takes it) trained by SFT on
    `SEARCH_TURN` then, after the tiny retriever's passages, `ANSWER_TURN` for `questions`,
    saved as an HF folder at `out` (reused when already there). Greedy, it searches once and
    answers "Berlin" on any question like these."""
    if (out / "config.json").exists():
        return out
    import torch

    from pvpo.envs.data import QAExample
    from pvpo.envs.episode import EpisodeConfig
    from pvpo.retriever.index import load_retriever
    from pvpo.retriever.testing import TINY_CORPUS, build_tiny_index
    from pvpo.reward import SEARCH_R1
    from pvpo.trainer.config import TinyModelConfig
    from pvpo.trainer.policy import build_tiny_policy, save_policy
    from pvpo.trainer.warmstart import oracle_trajectories, warm_start

    torch.manual_seed(seed)
    examples = [QAExample(f"t/{i}", q, ("Berlin",)) for i, q in enumerate(questions)]
    episode = EpisodeConfig(protocol=SEARCH_R1, reward="em", max_turns=4, topk=3, max_obs_chars=None)
    texts = [episode.prompt(e) for e in examples] + [p["title"] + " " + p["text"] for p in TINY_CORPUS]
    texts += [SEARCH_TURN, ANSWER_TURN, SEARCH_R1.correction_message()]
    cfg = TinyModelConfig(hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=128, vocab_size=768)
    policy = build_tiny_policy(texts, cfg, tags=["think", "search", "information", "answer"], seed=seed)
    retriever = load_retriever(build_tiny_index(out.parent / "retriever"), device="cpu")
    try:
        trajs = oracle_trajectories(examples, lambda _: [SEARCH_TURN, ANSWER_TURN], policy.tokenizer, retriever, episode)
    finally:
        retriever.close()
    warm_start(policy.model, trajs, policy.tokenizer.pad_token_id, steps=steps, lr=1e-2, batch_size=4, seed=seed,
               show_progress=False)  # fmt: skip
    policy.model.eval()
    save_policy(policy, out)
    return out
