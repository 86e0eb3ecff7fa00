"""Test helpers for the evaluation path: a tiny policy that has learned to search and answer."""

from __future__ import annotations

from pathlib import Path

# No think blocks: every token of these turns then has one possible successor, which a one-layer
# model learns in a few dozen steps (with "<think> look it up </think>" it wrote "up </search>").
SEARCH_TURN = "<search> capital of Germany </search>"
ANSWER_TURN = "<answer> Berlin </answer>"
JUDGE_REPLY = "4"  # a bare digit right after the prompt: "Score: 4" sometimes came out "Score: </answer>"


def searching_policy(out: Path, questions: list[str], *, steps: int = 60, seed: int = 0) -> Path:
    """A tiny Qwen2 (hidden 64, head_dim 32 so vLLM's CPU attention takes it) trained by SFT on
    `SEARCH_TURN` then, after the tiny retriever's passages, `ANSWER_TURN` for `questions`, and
    on `JUDGE_REPLY` after LLM-judge prompts about them; saved as an HF folder at `out` (reused
    when already there). Greedy, on questions like these it searches once, then answers
    "Berlin" (EM 0 on real questions), and as a judge replies "4"."""
    if (out / "config.json").exists():
        return out
    import torch

    from pvpo.envs.data import QAExample
    from pvpo.envs.episode import EpisodeConfig
    from pvpo.evaluation.judge import judge_prompt
    from pvpo.retriever.index import load_retriever
    from pvpo.retriever.testing import TINY_CORPUS, build_tiny_index
    from pvpo.reward import SEARCH_R1
    from pvpo.trainer.config.policy import TinyModelConfig
    from pvpo.trainer.model.policy import build_tiny_policy, save_policy
    from pvpo.trainer.model.warmstart import warm_start
    from pvpo.trainer.rollout.replay import oracle_trajectories

    torch.manual_seed(seed)
    examples = [QAExample(f"t/{i}", q, ("Berlin",)) for i, q in enumerate(questions)]
    episode = EpisodeConfig(
        protocol=SEARCH_R1, reward="em", max_turns=4, topk=3, max_obs_chars=None, prompt_template="search_r1"
    )
    texts = [episode.prompt(e) for e in examples] + [p["title"] + " " + p["text"] for p in TINY_CORPUS]
    judge_prompts = [judge_prompt(q, ["Berlin"], "Berlin") for q in questions[:8]]
    texts += [SEARCH_TURN, ANSWER_TURN, JUDGE_REPLY, SEARCH_R1.correction_message(), *judge_prompts]
    cfg = TinyModelConfig(
        hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=128, vocab_size=768
    )
    policy = build_tiny_policy(texts, cfg, tags=["think", "search", "information", "answer"], seed=seed)
    retriever = load_retriever(build_tiny_index(out.parent / "retriever"), device="cpu")
    try:
        trajs = oracle_trajectories(
            examples, lambda _: [SEARCH_TURN, ANSWER_TURN], policy.tokenizer, retriever, episode
        )
    finally:
        retriever.close()
    from pvpo.trainer.rollout.trajectory import Trajectory

    tok = policy.tokenizer
    for k, p in enumerate(judge_prompts * 2):  # weighted up: at 1 in 5 samples it wrote "Score: </answer>"
        t = Trajectory(f"judge/{k}", list(tok.encode(p, add_special_tokens=False)))
        reply = [*tok.encode(JUDGE_REPLY, add_special_tokens=False), tok.eos_token_id]
        t.append_model(reply, [0.0] * len(reply))
        trajs.append(t)
    warm_start(
        policy.model,
        trajs,
        policy.tokenizer.pad_token_id,
        steps=steps,
        lr=1e-2,
        batch_size=4,
        seed=seed,
        show_progress=False,
    )
    policy.model.eval()
    save_policy(policy, out)
    return out
