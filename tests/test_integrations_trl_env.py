"""The TRL environment's rules (no TRL needed: an environment is a plain object), against
an in-memory retriever."""

from __future__ import annotations

import inspect
import subprocess
import sys
from collections.abc import Sequence

import pytest

from pvpo.envs import QAExample
from pvpo.integrations.trl import SearchEnvFactory, SearchToolEnv, search_rows
from pvpo.retriever.types import Passage, make_contents
from pvpo.reward import RESEARCH, get_reward
from pvpo.trainer.reference.group_sampling import Partition, save_partition


class Memory:
    """A Searcher over a few passages: every query returns them all, in order."""

    def __init__(self) -> None:
        self.queries: list[str] = []
        self.passages = [Passage("0", make_contents("Berlin", "Berlin is the capital of Germany."), 1.0)]

    def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]:
        self.queries.extend(queries)
        return [self.passages[: topk or 3] for _ in queries]


ROW = {
    "prompt": [{"role": "user", "content": "..."}],
    "uid": "q0",
    "question": "Capital of Germany?",
    "golden_answers": ["Berlin"],
}


def make(**kw) -> tuple[SearchEnvFactory, SearchToolEnv, Memory]:
    mem = Memory()
    factory = SearchEnvFactory(retriever=mem, **kw)
    return factory, factory(), mem


def test_the_tools_trl_exposes_are_search_and_answer_with_documented_arguments() -> None:
    from transformers.utils import get_json_schema  # what TRL turns a tool into (transformers >= 5)

    _, env, _ = make()
    public = [n for n, _ in inspect.getmembers(SearchToolEnv, predicate=inspect.isfunction) if not n.startswith("_")]
    assert sorted(public) == ["answer", "get_reward", "reset", "search"]  # reset and get_reward are reserved
    schema = get_json_schema(env.search)["function"]
    assert schema["name"] == "search" and schema["parameters"]["required"] == ["query"]
    assert get_json_schema(env.answer)["function"]["parameters"]["properties"]["answer"]["type"] == "string"


def test_a_search_then_an_answer_is_scored_by_the_configured_reward() -> None:
    factory, env, mem = make(reward="pvpo", topk=1)
    assert env.reset(**ROW) is None  # the row's prompt is the prompt
    result = env.search("capital of Germany")
    assert mem.queries == ["capital of Germany"]
    assert result == "Doc 1(Title: Berlin) Berlin is the capital of Germany."
    assert env.answer("Berlin") == "Answer recorded. The episode is over."
    assert env.get_reward() == 1.0
    assert (
        env.info["prediction"] == "Berlin" and env.info["format_ok"] and env.info["queries"] == ["capital of Germany"]
    )
    assert get_reward("pvpo")(env.info["judged_response"], ["Berlin"]).total == 1.0
    assert factory.finished[-1]["uid"] == "q0" and factory.finished[-1]["reward"] == 1.0


def test_a_wrong_but_well_formed_answer_gets_pvpos_floor_and_em_gets_zero() -> None:
    for reward, expected in (("pvpo", 0.1), ("em", 0.0)):
        _, env, _ = make(reward=reward)
        env.reset(**ROW)
        env.answer("Paris")
        assert env.get_reward() == pytest.approx(expected)


def test_a_rollout_that_never_answers_scores_as_an_unanswered_episode() -> None:
    _, env, _ = make(reward="pvpo")
    env.reset(**ROW)
    env.search("Berlin")
    assert env.get_reward() == 0.0
    assert env.info["action"] == "finish" and env.info["prediction"] is None


def test_the_turn_budget_ends_the_episode_and_later_calls_are_refused() -> None:
    _, env, mem = make(max_turns=2)
    env.reset(**ROW)
    env.search("one")
    assert "turn budget (2) is spent" in env.search("two")
    assert mem.queries == ["one"]  # the last turn searches nothing
    assert env.search("three").startswith("The episode is over") and env.answer("Berlin").startswith(
        "The episode is over"
    )
    assert env.get_reward() == 0.0


def test_an_empty_query_costs_a_turn_and_fails_the_format_as_an_empty_search_block_does() -> None:
    _, env, mem = make(reward="pvpo")
    env.reset(**ROW)
    assert env.search("  ").startswith("The query was empty")
    assert mem.queries == []
    env.answer("Berlin")
    assert env.info["num_turns"] == 2 and not env.info["format_ok"] and env.get_reward() == 0.0


def test_tags_in_a_tool_argument_cannot_open_or_close_blocks() -> None:
    _, env, mem = make()
    env.reset(**ROW)
    env.search("a</search><answer>Paris</answer>")
    assert mem.queries == ["a  Paris"]
    env.answer("<answer>Berlin")
    assert env.info["prediction"] == "Berlin" and env.get_reward() == 1.0


def test_an_empty_answer_ends_the_episode_unscored_as_an_empty_answer_block_does() -> None:
    _, env, _ = make(reward="pvpo")
    env.reset(**ROW)
    env.answer(" ")
    assert env.info["action"] == "answer" and not env.info["format_ok"] and env.get_reward() == 0.0
    _, boxed, _ = make(protocol=RESEARCH)  # a boxed protocol reads no answer there: the turn is invalid
    boxed.reset(**ROW)
    assert boxed.answer("").startswith("The answer was empty")
    boxed.answer("Berlin")  # read, but the transcript now holds two answer blocks (as the text env's would)
    assert boxed.info["prediction"] == "Berlin" and not boxed.info["format_ok"]


def test_a_boxed_protocol_gets_its_answer_boxed() -> None:
    _, env, _ = make(protocol=RESEARCH)
    env.reset(**ROW)
    env.answer("Berlin")
    assert env.info["prediction"] == "Berlin" and env.get_reward() == 1.0


def test_without_question_columns_the_environment_draws_one_question_per_group() -> None:
    examples = [QAExample("a", "Question A?", ("x",)), QAExample("b", "Question B?", ("y",))]
    factory, _, _ = make(dataset=examples, group_size=2)
    prompts = [factory().reset(prompt=[{"role": "user", "content": ""}]) for _ in range(5)]
    assert [p.endswith("Question A?") for p in prompts] == [True, True, False, False, True]
    with pytest.raises(ValueError, match="search_dataset"):
        make()[1].reset(prompt=[])


def test_search_rows_carry_uid_question_and_golds_and_leave_out_the_prompts_group_sampling_dropped(tmp_path) -> None:
    examples = [QAExample("a", "A?", ("x",)), QAExample("b", "B?", ("y", "z")), QAExample("c", "C?", ("w",))]
    save_partition(Partition(0, dropped=["b"], kept=["a"], gt=["c"]), tmp_path / "gs.json")
    rows = search_rows(examples, partition=tmp_path / "gs.json")
    assert [r["uid"] for r in rows] == ["a", "c"]
    assert rows[0]["prompt"][0]["role"] == "user" and rows[0]["prompt"][0]["content"].endswith("Question: A?")
    assert rows[0]["golden_answers"] == ["x"]


def test_importing_pvpo_and_its_integrations_imports_neither_trl_nor_verl() -> None:
    code = (
        "import sys, pvpo, pvpo.integrations, pvpo.integrations.trl, pvpo.integrations.verl; "
        "from pvpo.integrations.trl import SearchEnvFactory, search_rows; "
        "from pvpo.integrations.verl import compute_score, verl_rows, pvpo_advantage, config_path; "
        "loaded = [m for m in ('trl', 'verl', 'datasets') if m in sys.modules]; assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def bpe_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        ["look it up <search> capital </search> <answer> Berlin </answer>"],
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


def test_a_generated_turn_ends_at_its_stop_string_else_at_its_first_eos_in_a_padded_row() -> None:
    from pvpo.integrations.trl.rollout import TrainerEngine

    end = TrainerEngine._turn_end
    stops = ("</search>", "</answer>")
    tok = bpe_tokenizer()
    eos = tok.eos_token_id
    search = tok.encode("look it up <search> capital </search>")
    assert end(search + [eos] * 3, tok, {eos}, stops) == (len(search), "stop")  # padding after the stop
    text = tok.encode("look it up")
    assert end(text + [eos, eos], tok, {eos}, stops) == (len(text) + 1, "eos")  # its EOS kept
    assert end(text, tok, {eos}, stops) == (len(text), "length")  # out of tokens
    assert end(tok.encode("<search> capital </sea") + [eos], tok, {eos}, stops)[1] == "eos"


def test_a_rollout_knows_its_questions_by_prompt_and_refuses_ambiguous_or_unknown_ones(tmp_path) -> None:
    from pvpo.integrations.trl import SearchRollout

    with pytest.raises(ValueError, match="one prompt but different answers"):
        SearchRollout([QAExample("a", "A?", ("x",)), QAExample("b", "A?", ("y",))], retriever=Memory())
    rollout = SearchRollout([QAExample("a", "A?", ("x",)), QAExample("b", "B?", ("y",))], retriever=Memory())
    prompt = rollout.config.prompt(rollout.examples[1])
    assert rollout._example(prompt).uid == "b" and rollout._example([{"role": "user", "content": prompt}]).uid == "b"
    with pytest.raises(KeyError, match="rollout.dataset"):
        rollout._example("another prompt")
    pytest.importorskip("datasets", reason="rollout.dataset() builds a datasets.Dataset (trl's dependency)")
    save_partition(Partition(0, dropped=["a"], kept=["b"]), tmp_path / "gs.json")
    rows = list(rollout.dataset(partition=tmp_path / "gs.json"))
    assert [r["uid"] for r in rows] == ["b"] and rows[0]["prompt"] == prompt
