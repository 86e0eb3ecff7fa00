"""PVPO and our search environment in verl. Each test runs against the real verl where it
is importable (`make test-verl`: verl 0.9.1 in .venv-verl, its own transformers) and against a
stand-in of the interface the adapter uses elsewhere (verl needs transformers < 5.11, our venv
pins 5.24: see tests/verl_standin.py and docs/guides/integrations.md). No verl training run happens here."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import yaml
from retriever_support import CountingRetriever
from verl_support import REAL_VERL, agent_loop, chat_tokenizer

from pvpo.integrations.verl.configs import AGENT_LOOP_KEYS, config_path, write_config
from pvpo.integrations.verl.data import TOOL_AGENT, verl_rows, write_parquet
from pvpo.integrations.verl.estimator import pvpo_advantage
from pvpo.integrations.verl.reward import compute_score, golds_of
from pvpo.retriever.server import BackgroundServer
from pvpo.reward import get_reward
from pvpo.trainer import get_estimator
from pvpo.trainer.reference.anchor import AnchorStore
from pvpo.trainer.reference.group_sampling import Partition, save_partition


@pytest.mark.skipif(REAL_VERL, reason="verl is installed: nothing is missing")
@pytest.mark.parametrize("module", ["agent_loop", "search_tool", "plugin"])
def test_the_adapter_without_verl_says_how_to_install_it(module: str) -> None:
    code = f"import pvpo.integrations.verl.{module}"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    last = res.stderr.strip().splitlines()[-1]
    assert res.returncode == 1 and last.startswith("ModuleNotFoundError: pvpo.integrations.verl."), res.stderr
    assert "needs verl, which is not installed here (no module named 'verl'): pip install 'pvpo-search[verl]'" in last


def write_anchor(path: Path, values: dict[str, float]) -> Path:
    store = AnchorStore(path)
    for uid, value in values.items():
        store.update(uid, [value], [0.0])
    return store.save()


# ---- the estimator -------------------------------------------------------------------------------


def test_the_plugin_registers_pvpo_in_verls_estimator_registry(verl_api) -> None:
    importlib.import_module("pvpo.integrations.verl.plugin")
    assert verl_api.core_algos.get_adv_estimator_fn("pvpo") is pvpo_advantage
    importlib.import_module("pvpo.integrations.verl.estimator").register()  # twice: the same function, accepted


@pytest.mark.skipif(not REAL_VERL, reason="needs verl installed (make test-verl): its entry points load on import")
def test_importing_verl_loads_the_plugin_through_its_entry_point() -> None:
    code = (
        "import verl; from verl.trainer.ppo.core_algos import get_adv_estimator_fn; "
        "from pvpo.integrations.verl.estimator import pvpo_advantage; "
        "assert get_adv_estimator_fn('pvpo') is pvpo_advantage"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def hand_made_batch(tmp_path: Path) -> dict[str, Any]:
    """Six responses of two prompts (groups interleaved, as uids need not be adjacent), their
    golds, an anchor per prompt, and responses of different lengths."""
    responses = [
        "<answer>Berlin</answer>",
        "<answer>Paris</answer>",
        "<answer>Fleming</answer>",
        "no answer",
        "<answer>Alexander Fleming</answer>",
        "<answer>Berlin, Germany</answer>",
    ]
    uids = ["q0", "q0", "q1", "q0", "q1", "q0"]
    golds = {"q0": ["Berlin"], "q1": ["Alexander Fleming"]}
    anchors = {"q0": 0.4, "q1": 0.55}
    return {
        "responses": responses,
        "uids": uids,
        "golds": golds,
        "anchors": anchors,
        "anchor_file": write_anchor(tmp_path / "anchor.json", anchors),
        "lengths": [5, 3, 7, 2, 6, 4],
    }


def verl_token_rewards(scores: list[float], lengths: list[int], width: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's layout: each trajectory's score on its last response token, mask 1 on its tokens."""
    rewards = torch.zeros(len(scores), width)
    mask = torch.zeros(len(scores), width, dtype=torch.long)
    for i, (score, n) in enumerate(zip(scores, lengths)):
        mask[i, :n] = 1
        rewards[i, n - 1] = score
    return rewards, mask


def test_verls_pvpo_estimator_on_the_anchored_scores_equals_our_pvpo_estimator(verl_api, tmp_path) -> None:
    b = hand_made_batch(tmp_path)
    importlib.import_module("pvpo.integrations.verl.plugin")
    scores = [
        compute_score("pvpo", text, {"target": b["golds"][uid]}, {"uid": uid}, anchors=str(b["anchor_file"]))["score"]
        for text, uid in zip(b["responses"], b["uids"])
    ]
    token_rewards, mask = verl_token_rewards(scores, b["lengths"])
    index = [f"step-uuid-{uid}" for uid in b["uids"]]  # verl's per-step group ids: they name no prompt
    estimator = verl_api.core_algos.get_adv_estimator_fn("pvpo")
    advantages, returns = estimator(token_level_rewards=token_rewards, response_mask=mask, index=index, config=None)

    raw = torch.tensor([get_reward("pvpo")(t, b["golds"][u]).total for t, u in zip(b["responses"], b["uids"])])
    ours = get_estimator("pvpo")(raw, b["uids"], anchors=b["anchors"])
    assert torch.allclose(advantages[:, 0], ours, atol=1e-6)
    assert torch.equal(advantages, returns)
    assert torch.allclose(advantages, ours.unsqueeze(1).float() * mask)  # every response token, no padding
    assert not torch.allclose(ours, get_estimator("grpo")(raw, b["uids"]))  # and it is not GRPO's


@pytest.mark.skipif(not REAL_VERL, reason="needs verl installed (make test-verl)")
def test_verls_own_compute_advantage_with_adv_estimator_pvpo_gives_our_advantages(tmp_path) -> None:
    import numpy as np
    from verl.protocol import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    importlib.import_module("pvpo.integrations.verl.plugin")
    b = hand_made_batch(tmp_path)
    scores = [
        compute_score("pvpo", t, b["golds"][u], {"uid": u}, anchors=b["anchors"])["score"]
        for t, u in zip(b["responses"], b["uids"])
    ]
    token_rewards, mask = verl_token_rewards(scores, b["lengths"])
    data = DataProto.from_dict(
        tensors={"token_level_rewards": token_rewards, "response_mask": mask},
        non_tensors={"uid": np.array([f"uuid-{u}" for u in b["uids"]], dtype=object)},
    )
    out = compute_advantage(data, adv_estimator="pvpo", config=None)
    raw = torch.tensor([get_reward("pvpo")(t, b["golds"][u]).total for t, u in zip(b["responses"], b["uids"])])
    assert torch.allclose(out.batch["advantages"][:, 0], get_estimator("pvpo")(raw, b["uids"], anchors=b["anchors"]))


def test_the_estimator_refuses_rewards_and_mask_of_different_shapes() -> None:
    with pytest.raises(ValueError, match="one shape"):
        pvpo_advantage(torch.zeros(2, 3), torch.ones(2, 4))


# ---- the reward ----------------------------------------------------------------------------------


def test_compute_score_reads_searchr1_ground_truth_and_subtracts_the_anchor_of_the_rows_uid(tmp_path) -> None:
    anchor_file = write_anchor(tmp_path / "anchor.json", {"q0": 0.25})
    plain = compute_score("nq", "<answer>Berlin</answer>", {"target": ["Berlin", "berlin city"]})
    assert plain == {"score": 1.0, "pvpo_reward": 1.0, "em": 1.0, "f1": 1.0, "format_ok": 1.0}
    anchored = compute_score("nq", "<answer>Berlin</answer>", ["Berlin"], {"uid": "q0"}, anchors=anchor_file)
    assert anchored["score"] == pytest.approx(0.75) and anchored["pvpo_anchor"] == 0.25
    em = compute_score("nq", "<think>x</think><answer>Paris</answer>", "Berlin", reward="em")
    assert em["score"] == 0.0 and em["format_ok"] == 1.0
    with pytest.raises(KeyError, match="no reference anchor for uid 'q9'"):
        compute_score("nq", "<answer>Berlin</answer>", "Berlin", {"uid": "q9"}, anchors=anchor_file)
    assert golds_of({"target": ("a", "b")}) == ["a", "b"] and golds_of("a") == ["a"]


# ---- the data ------------------------------------------------------------------------------------


def test_verl_rows_carry_uid_prompt_and_golds_and_drop_what_group_sampling_dropped(tmp_path) -> None:
    from pvpo.envs import QAExample

    examples = [QAExample("a", "A?", ("x",)), QAExample("b", "B?", ("y",)), QAExample("c", "C?", ("z", "w"))]
    save_partition(Partition(0, dropped=["b"], kept=["a"], gt=["c"]), tmp_path / "gs.json")
    rows = verl_rows(examples, partition=tmp_path / "gs.json")
    assert [r["extra_info"]["uid"] for r in rows] == ["a", "c"]
    assert rows[1]["reward_model"] == {"style": "rule", "ground_truth": {"target": ["z", "w"]}}
    assert rows[0]["agent_name"] == "pvpo_search" and "<search>" in rows[0]["prompt"][0]["content"]
    tool_rows = verl_rows(examples, agent_name=TOOL_AGENT)
    assert tool_rows[0]["extra_info"]["tools_kwargs"]["search"]["create_kwargs"] == {"uid": "a"}
    pd = pytest.importorskip("pandas", reason="parquet needs pandas (with verl, or the dev extra's datasets)")
    back = pd.read_parquet(write_parquet(rows, tmp_path / "train.parquet"))
    assert list(back["extra_info"].map(lambda e: e["uid"])) == ["a", "c"]


# ---- the configs, the tool and the agent loop, against the tiny retriever on loopback ------------


def test_the_shipped_configs_name_our_classes_and_write_config_sets_only_known_keys(verl_api, tmp_path) -> None:
    import inspect

    (entry,) = yaml.safe_load(config_path("agent_loop.yaml").read_text())
    assert entry["name"] == "pvpo_search" and entry["_target_"].endswith("agent_loop.PVPOSearchAgentLoop")
    loop_cls = importlib.import_module("pvpo.integrations.verl.agent_loop").PVPOSearchAgentLoop
    params = inspect.signature(loop_cls.__init__).parameters
    assert set(AGENT_LOOP_KEYS) == {n for n, p in params.items() if p.kind is p.KEYWORD_ONLY}
    assert set(entry) - {"name", "_target_"} <= set(AGENT_LOOP_KEYS)
    tool = yaml.safe_load(config_path("search_tool.yaml").read_text())["tools"][0]
    assert (
        tool["class_name"] == "pvpo.integrations.verl.search_tool.PVPOSearchTool" and tool["config"]["type"] == "native"
    )
    out = write_config("agent_loop.yaml", tmp_path / "a.yaml", anchors=tmp_path / "anchor.json", reward="em")
    (written,) = yaml.safe_load(out.read_text())
    assert written["anchors"] == str(tmp_path / "anchor.json") and written["reward"] == "em"
    with pytest.raises(ValueError, match="no setting anchor; known: retriever_url"):
        write_config("agent_loop.yaml", tmp_path / "b.yaml", anchor="x")
    with pytest.raises(ValueError, match="no verl config"):
        config_path("ppo.yaml")


@pytest.fixture(scope="module")
def served(tiny):
    counting = CountingRetriever(tiny)
    with BackgroundServer(counting) as server:
        yield server.url, counting


def test_the_search_tool_config_builds_our_tool_which_searches_our_server(verl_api, served, tmp_path) -> None:
    url, counting = served
    # a trailing /retrieve, as verl's own search tool configs write the URL
    write_config("search_tool.yaml", tmp_path / "tools.yaml", retrieval_service_url=url + "/retrieve")
    config = yaml.safe_load((tmp_path / "tools.yaml").read_text())
    if verl_api.real:
        from verl.tools.tool_registry import initialize_tools_from_config

        (tool,) = initialize_tools_from_config(str(tmp_path / "tools.yaml"))
    else:
        module = importlib.import_module("pvpo.integrations.verl.search_tool")
        schema = sys.modules["verl.tools.schemas"].OpenAIFunctionToolSchema.model_validate(
            config["tools"][0]["tool_schema"]
        )
        tool = module.PVPOSearchTool(config["tools"][0]["config"], schema)
    assert type(tool).__name__ == "PVPOSearchTool" and tool.name == "search"
    before = len(counting.queries)
    response, reward, metrics = asyncio.run(
        tool.execute("id", {"query_list": ["capital of Germany", "who wrote Hamlet"]})
    )
    assert counting.queries[before:] == ["capital of Germany", "who wrote Hamlet"]
    first, second = response.text.split("\n---\n")
    assert first.startswith("Doc 1(Title: Berlin)") and "Shakespeare" in second
    assert reward == 0.0 and metrics == {"num_queries": 2, "total_results": 6}


class ScriptedServer:
    """verl's server manager, answering each generate call with the next scripted text's tokens."""

    def __init__(self, tokenizer: Any, turns: list[str]) -> None:
        self.tokenizer, self.turns, self.calls = tokenizer, list(turns), []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict, **kw: Any) -> Any:
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), "params": dict(sampling_params)})
        ids = self.tokenizer.encode(self.turns.pop(0), add_special_tokens=False)[: sampling_params["max_tokens"]]
        return SimpleNamespace(token_ids=ids, log_probs=[-0.5] * len(ids))


def run_loop(verl_api, tokenizer: Any, server: Any, entry: dict[str, Any], params: dict, **kw: Any) -> Any:
    """Build the agent loop inside the event loop and run it on our sample, as verl's worker does
    (verl's AgentLoopBase binds the running loop when it is built)."""

    async def go() -> Any:
        return await agent_loop(verl_api, tokenizer, server, entry, **kw).run(params, **sample())

    return asyncio.run(go())


def sample(uid: str = "q0") -> dict[str, Any]:
    """A verl sample of our rows, as the agent loop receives it (verl_rows' columns, raw_prompt)."""
    from pvpo.envs import QAExample

    row = verl_rows([QAExample(uid, "What is the capital of Germany?", ("Berlin",))])[0]
    return {**row, "raw_prompt": row["prompt"], "uid": "verl-step-uuid", "index": 0}


def test_the_agent_loop_config_runs_our_episode_token_exact_with_the_anchored_reward(
    verl_api, served, tmp_path
) -> None:
    url, counting = served
    anchor_file = write_anchor(tmp_path / "anchor.json", {"q0": 0.3})
    written = write_config("agent_loop.yaml", tmp_path / "agent.yaml", retriever_url=url, topk=1, anchors=anchor_file)
    (entry,) = yaml.safe_load(written.read_text())
    tok = chat_tokenizer()
    turns = ["<think>I need the capital.</think><search> capital of Germany </search>", "<answer> Berlin </answer>"]
    server = ScriptedServer(tok, turns)
    before = len(counting.queries)
    out = run_loop(verl_api, tok, server, entry, {"temperature": 1.0, "logprobs": True})
    assert verl_api.agent_loop._agent_loop_registry["pvpo_search"]["_target_"] == entry["_target_"]  # registered too

    assert counting.queries[before:] == ["capital of Germany"]
    prompt_ids = server.calls[0]["prompt_ids"]
    assert out.prompt_ids == prompt_ids
    turn1, turn2 = (tok.encode(t, add_special_tokens=False) for t in turns)
    obs = out.response_ids[len(turn1) : len(out.response_ids) - len(turn2)]
    assert tok.decode(obs).startswith("\n\n<information>Doc 1(Title: Berlin)")
    assert out.response_ids == turn1 + obs + turn2  # the model's tokens exactly as produced
    assert out.response_mask == [1] * len(turn1) + [0] * len(obs) + [1] * len(turn2)
    assert out.response_logprobs == [-0.5] * len(turn1) + [0.0] * len(obs) + [-0.5] * len(turn2)
    assert server.calls[1]["prompt_ids"] == prompt_ids + turn1 + obs  # the second turn continues the first
    assert server.calls[0]["params"]["stop"] == ["</search>", "</answer>"]
    assert server.calls[0]["params"]["include_stop_str_in_output"] is True
    assert server.calls[1]["params"]["max_tokens"] == 256 - len(turn1) - len(obs)
    assert len({c["request_id"] for c in server.calls}) == 1
    assert out.reward_score == pytest.approx(1.0 - 0.3)  # pvpo reward 1.0 minus the anchor of q0
    info = out.extra_fields["reward_extra_info"]
    assert info["pvpo_reward"] == 1.0 and info["pvpo_anchor"] == 0.3 and info["em"] == 1.0
    assert out.extra_fields["pvpo_uid"] == "q0"


def test_the_agent_loop_ends_an_episode_at_eos_without_an_action_and_at_its_token_budget(verl_api, served) -> None:
    tok = chat_tokenizer()
    entry = {"_target_": "pvpo.integrations.verl.agent_loop.PVPOSearchAgentLoop", "retriever_url": served[0]}
    server = ScriptedServer(tok, ["I think it is Berlin<|endoftext|>"])
    out = run_loop(verl_api, tok, server, entry, {})
    assert len(server.calls) == 1 and out.reward_score == 0.0 and out.response_logprobs is None
    assert set(out.response_mask) == {1}
    long_turn = "<search> capital of Germany </search>"
    server = ScriptedServer(tok, [long_turn] * 10)
    out = run_loop(verl_api, tok, server, entry, {}, response_length=40)
    assert len(out.response_ids) == len(out.response_mask) <= 40
    assert out.reward_score == 0.0  # no answer within the budget


# ---- verl's own config and loaders ---------------------------------------------------------------

# the overrides of docs/guides/integrations.md's verl command (keep the two in step)
README_OVERRIDES = [
    "algorithm.adv_estimator=pvpo",
    "data.train_files=data/train.parquet",
    "data.val_files=data/test.parquet",
    "data.train_batch_size=64",
    "data.max_prompt_length=512",
    "data.max_response_length=2048",
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.rollout.agent.agent_loop_config_path=data/agent_loop.yaml",
    "actor_rollout_ref.actor.ppo_mini_batch_size=32",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "trainer.n_gpus_per_node=8",
]


@pytest.mark.skipif(not REAL_VERL, reason="needs verl installed (make test-verl)")
def test_the_readme_overrides_compose_and_pass_verls_config_validation() -> None:
    import os

    import verl
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    with initialize_config_dir(
        config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"), version_base=None
    ):
        cfg = compose(config_name="ppo_trainer", overrides=README_OVERRIDES)
    assert cfg.algorithm.adv_estimator == "pvpo" and not need_critic(cfg)  # PVPO needs no critic
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))


@pytest.mark.skipif(not REAL_VERL, reason="needs verl installed (make test-verl)")
def test_verls_custom_reward_function_loader_gives_our_compute_score_with_its_anchor(tmp_path) -> None:
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    anchor_file = write_anchor(tmp_path / "anchor.json", {"q0": 0.25})
    cfg = OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": "pkg://pvpo.integrations.verl.reward",
                    "name": "compute_score",
                    "reward_kwargs": {"anchors": str(anchor_file)},
                }
            }
        }
    )
    fn = get_custom_reward_fn(cfg)
    out = fn(
        data_source="nq",
        solution_str="<answer>Berlin</answer>",
        ground_truth={"target": ["Berlin"]},
        extra_info={"uid": "q0"},
    )
    assert out["score"] == pytest.approx(0.75) and out["pvpo_reward"] == 1.0
