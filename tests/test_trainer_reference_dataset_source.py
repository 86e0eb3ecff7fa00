"""The `dataset` GT source: plans from MuSiQue's decomposition and HotpotQA's supporting facts
(`pvpo.envs.dataset_gt`), the retrieval check, and the trajectories replayed through the env."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from trainer_support import OverlapSearcher

from pvpo.envs.data import Paragraph, QAExample
from pvpo.envs.dataset_gt import (
    NoPlan,
    dataset_plan,
    hotpotqa_plan,
    musique_plan,
    plan_turns,
    substitute,
    twowiki_plan,
)
from pvpo.envs.episode import EpisodeConfig
from pvpo.retriever.types import Passage, make_contents
from pvpo.reward import SEARCH_R1
from pvpo.trainer.reference.dataset_source import CUT, MISSED, check_retrieval, dataset_trajectories
from tests.conftest import shared_data

P_JOURNAL = Paragraph(
    "Journal of Psychotherapy Integration",
    "The Journal of Psychotherapy Integration is published by the American Psychological Association.",
    True,
)
P_APA = Paragraph(
    "American Psychological Association",
    "G. Stanley Hall was the first president of the American Psychological Association.",
    True,
)
P_OTHER = Paragraph("Lake Tahoe", "Lake Tahoe is a freshwater lake in the Sierra Nevada.", False)

MUSIQUE = QAExample(
    "musique/1",
    "Who was the first president of the association which published Journal of Psychotherapy Integration?",
    ("G. Stanley Hall",),
    (P_OTHER, P_JOURNAL, P_APA),
    {
        "question_decomposition": [
            {
                "question": "What company published Journal of Psychotherapy Integration?",
                "answer": "American Psychological Association",
                "paragraph": 1,
            },
            {"question": "Who was the first president of #1 ?", "answer": "G. Stanley Hall", "paragraph": 2},
        ]
    },
)

P_LILU = Paragraph("Lilu (mythology)", "Lilu is a class of demon. It is related to Gallu.", True)
P_ALU = Paragraph("Alû", "Alû is a demon. It has no mouth. A Lilu is a spirit in the Akkadian lore.", True)
HOTPOT_BRIDGE = QAExample(
    "hotpotqa/b",
    "If Gallu is a demon Lilu is what?",
    ("a spirit",),
    (P_ALU, P_LILU, P_OTHER),
    {"type": "bridge", "supporting_facts": [["Alû", 2], ["Lilu (mythology)", 0]]},
)
P_NOLAN = Paragraph("Christopher Nolan", "Christopher Nolan is a British film director.", True)
P_SATHISH = Paragraph("Sathish Kalathil", "Sathish Kalathil is an Indian film director.", True)
HOTPOT_COMPARISON = QAExample(
    "hotpotqa/c",
    "Are Christopher Nolan and Sathish Kalathil both film directors?",
    ("yes",),
    (P_SATHISH, P_NOLAN),
    {"type": "comparison", "supporting_facts": [["Christopher Nolan", 0], ["Sathish Kalathil", 0]]},
)


def test_placeholders_take_earlier_answers_and_wikidata_relations_read_as_questions():
    assert substitute("Who was the first president of #1 ?", ["APA"]) == "Who was the first president of APA"
    assert substitute("Which state borders #2 to the east?", ["x", "Ohio"]) == "Which state borders Ohio to the east"
    assert substitute("Hello Love >> performer", []) == "performer of Hello Love"
    with pytest.raises(NoPlan, match="#2"):
        substitute("Where was #2 born?", ["only one"])


def test_musique_plan_searches_each_sub_question_for_its_supporting_paragraph():
    plan = musique_plan(MUSIQUE)
    assert [h.query for h in plan.hops] == [
        "What company published Journal of Psychotherapy Integration",
        "Who was the first president of American Psychological Association",
    ]
    assert [h.paragraph for h in plan.hops] == [P_JOURNAL, P_APA]
    assert plan.answer == "G. Stanley Hall"


def test_hotpotqa_bridge_reads_the_answers_paragraph_last_and_keeps_its_supporting_sentence():
    plan = hotpotqa_plan(HOTPOT_BRIDGE)
    # The answer occurs in Alû's paragraph only, so Lilu's (the bridge entity) is read first.
    assert [h.query for h in plan.hops] == ["Lilu (mythology)", "Alû"]
    assert plan.hops[1].finding == "A Lilu is a spirit in the Akkadian lore."
    assert plan.answer == "a spirit"


def test_hotpotqa_comparison_looks_up_both_entities_in_annotation_order():
    plan = hotpotqa_plan(HOTPOT_COMPARISON)
    assert [h.paragraph for h in plan.hops] == [P_NOLAN, P_SATHISH]
    assert plan_turns(plan)[-1].endswith("<answer>yes</answer>")


def test_a_first_paragraph_the_question_does_not_name_is_searched_with_the_question():
    question = "Which demon of the Akkadian lore is a spirit?"
    ex = QAExample("hotpotqa/q", question, ("a spirit",), (P_ALU, P_LILU), dict(HOTPOT_BRIDGE.metadata))
    plan = hotpotqa_plan(ex)
    assert [h.query for h in plan.hops] == ["Which demon of the Akkadian lore is a spirit", "Alû"]
    assert plan_turns(plan)[0].startswith("<think>I need to find what the question asks.</think>")


def test_a_question_query_that_misses_its_paragraph_falls_back_to_the_titled_plan():
    question = "Which demon of the Akkadian lore is a spirit?"
    ex = QAExample("hotpotqa/q", question, ("a spirit",), (P_ALU, P_LILU), dict(HOTPOT_BRIDGE.metadata))
    first, titled = hotpotqa_plan(ex).candidates()
    assert titled.hops[0].query == "Lilu (mythology)" and titled.fallback is None
    searcher = OverlapSearcher(_passages(P_LILU, P_ALU))  # the question's words are Alû's passage's
    assert check_retrieval([first, titled], searcher, EpisodeConfig(topk=1)) == [(1, MISSED), None]


def test_the_dataset_source_writes_the_fallback_plan_and_counts_it(tiny_tokenizer):
    question = "Which demon of the Akkadian lore is a spirit?"
    ex = QAExample("hotpotqa/q", question, ("a spirit",), (P_ALU, P_LILU), dict(HOTPOT_BRIDGE.metadata))
    searcher = OverlapSearcher(_passages(P_LILU, P_ALU))
    (traj,), counts = dataset_trajectories([ex], tiny_tokenizer, searcher, EpisodeConfig(max_turns=4, topk=1))
    assert traj is not None and counts["fallback_plan"] == 1 and counts["written"] == 1
    assert "<search>Lilu (mythology)</search>" in tiny_tokenizer.decode(traj.response_ids)


def test_musique_findings_quote_the_sentence_holding_the_hops_answer_before_stating_it():
    plan = musique_plan(MUSIQUE)
    assert plan.hops[0].finding.endswith(
        "The answer to 'What company published Journal of Psychotherapy Integration' is American Psychological Association."
    )
    evidence = plan.hops[0].finding.split(" The answer to ")[0]
    assert "American Psychological Association" in evidence and evidence in P_JOURNAL.text


def test_hotpotqa_findings_are_the_sentences_the_annotation_numbers_as_the_file_splits_them(tmp_path: Path):
    from pvpo.envs.loaders import load_dataset

    raw = [
        {
            "_id": "x1",
            "question": "Which river flows through Town A?",
            "answer": "Blue River",
            "type": "bridge",
            "supporting_facts": [["Town A", 1], ["Blue River", 0]],
            "context": [
                ["Town A", ["( c.", " 1200) Town A is old.", " The Blue River flows through it."]],
                ["Blue River", ["Blue River is a river.", " It is blue."]],
            ],
        }
    ]
    path = tmp_path / "h.json"
    path.write_text(json.dumps(raw))
    (ex,) = load_dataset(path)
    assert ex.metadata["supporting_sentences"] == {
        "Town A": ["1200) Town A is old."],
        "Blue River": ["Blue River is a river."],
    }
    plan = hotpotqa_plan(ex)
    assert plan.hops[0].finding == "1200) Town A is old."  # not "( c.", which a re-split of the joined text gave


def test_examples_without_an_annotation_have_no_plan():
    with pytest.raises(NoPlan, match="neither"):
        dataset_plan(QAExample("nq/1", "who wrote hamlet", ("Shakespeare",)))
    missing = QAExample("h/2", "q", ("a",), (P_OTHER,), {"supporting_facts": [["Nowhere", 0]]})
    with pytest.raises(NoPlan, match="Nowhere"):
        dataset_plan(missing)


def test_plan_turns_end_with_their_stop_strings_in_the_runs_tag_protocol():
    turns = plan_turns(musique_plan(MUSIQUE), SEARCH_R1)
    assert len(turns) == 3
    assert turns[0].startswith("<think>") and turns[0].endswith(
        "<search>What company published Journal of Psychotherapy Integration</search>"
    )
    assert "The answer to 'What company published" in turns[1]
    assert turns[2].endswith("<answer>G. Stanley Hall</answer>")


@pytest.fixture(scope="module")
def tiny_tokenizer():
    """A byte-level BPE tokenizer (any text encodes) with the protocol's tags as single tokens."""
    from pvpo.trainer.model.policy import train_tokenizer

    tags = [f"<{t}>" for t in ("think", "search", "information", "answer")]
    tags += [f"</{t}>" for t in ("think", "search", "information", "answer")]
    texts = [p.text for p in (P_JOURNAL, P_APA, P_OTHER, P_LILU, P_ALU, P_NOLAN, P_SATHISH)]
    return train_tokenizer(texts, vocab_size=400, extra_tokens=tags)


def _passages(*paragraphs: Paragraph) -> list[Passage]:
    return [Passage(str(i), make_contents(p.title, p.text)) for i, p in enumerate(paragraphs)]


def test_a_plan_whose_search_misses_its_paragraph_is_reported_by_hop():
    class Fixed:
        """Returns the journal's paragraph for every query: hop 2 (APA) never comes back."""

        def search(self, queries, topk=None):
            return [_passages(P_JOURNAL, P_OTHER) for _ in queries]

    plans = [musique_plan(MUSIQUE), hotpotqa_plan(HOTPOT_COMPARISON)]
    assert check_retrieval(plans, Fixed(), EpisodeConfig(topk=2)) == [(2, MISSED), (1, MISSED)]
    searcher = OverlapSearcher(_passages(P_JOURNAL, P_APA, P_OTHER, P_NOLAN, P_SATHISH))
    assert check_retrieval(plans, searcher, EpisodeConfig(topk=1)) == [None, None]


def test_dataset_source_replays_kept_plans_through_the_env_and_drops_the_rest(tiny_tokenizer):
    from pvpo.trainer.config.schema import load_config
    from pvpo.trainer.reference.gt_cache import GTCache, fetch_gt
    from pvpo.trainer.reference.gt_registry import GTContext, build_gt_source
    from pvpo.trainer.rollout.agent_loop import LoopConfig

    tok = tiny_tokenizer
    searcher = OverlapSearcher(_passages(P_JOURNAL, P_APA, P_OTHER, P_NOLAN, P_SATHISH))
    ctx = GTContext(tok, searcher, EpisodeConfig(max_turns=4, topk=1), LoopConfig())
    cfg = load_config(None, ["algorithm.gt.source=dataset"])
    src = build_gt_source("dataset", cfg.algorithm.gt, ctx)
    no_plan = QAExample("nq/1", "who wrote hamlet", ("Shakespeare",))
    exs = [MUSIQUE, no_plan, HOTPOT_COMPARISON, HOTPOT_BRIDGE]
    trajs = src.generate(exs, attempt=0)
    assert trajs[1] is None  # no annotation
    assert trajs[3] is None  # Lilu's title shares no word with a passage the searcher holds
    for t in (trajs[0], trajs[2]):
        assert t is not None and t.reward == 1.0 and t.num_tool_calls == 2 and t.finish_reason == "answer"
        assert t.old_logprobs == [0.0] * len(t.response_ids)  # deterministic: pi_gt = 1
        assert 0 in t.loss_mask and 1 in t.loss_mask  # env tokens masked out, the agent's kept
        assert tok.decode(t.response_ids).rstrip().endswith("</answer>")
    assert src.report == {"asked": 4, "no_plan": 1, "search_missed_paragraph": 1, "written": 2}
    cache = GTCache()
    counts = fetch_gt(exs, src, cache, attempts=4, min_reward=1.0)
    assert counts["gt/generated"] == 2 and counts["gt/failed"] == 2 and counts["gt/attempts"] == 4


@pytest.mark.slow
def test_dataset_gt_on_real_musique_and_hotpotqa_with_minilm_keeps_most_questions(tmp_path: Path, tiny_tokenizer):
    """The real annotations with the real retriever over the questions' own paragraphs: most plans
    retrieve every gold paragraph (the real-data recipe relies on it)."""
    from pvpo.envs.episode import EpisodeConfig
    from pvpo.envs.loaders import load_dataset
    from pvpo.retriever.build import build_index
    from pvpo.retriever.index import load_retriever
    from pvpo.trainer.reference.dataset_source import DatasetSource
    from pvpo.trainer.reference.gt_registry import GTContext
    from pvpo.trainer.rollout.agent_loop import LoopConfig

    kept = {}
    for name in ("musique_mini", "hotpotqa_mini"):
        questions = list(load_dataset(shared_data(name, "questions.json")))[:30]
        paragraphs = list(dict.fromkeys((p.title, p.text) for q in questions for p in q.paragraphs))
        corpus = tmp_path / f"{name}.json"
        corpus.write_text(json.dumps([{"title": t, "text": x} for t, x in paragraphs]))
        retriever = load_retriever(build_index(corpus, tmp_path / f"{name}_idx", show_progress=False), device="cpu")
        ctx = GTContext(tiny_tokenizer, retriever, EpisodeConfig(max_turns=5, topk=3), LoopConfig())
        src = DatasetSource(ctx)
        trajs = src.generate(questions, attempt=0)
        kept[name] = sum(t is not None and t.reward == 1.0 for t in trajs) / len(questions)
        retriever.close()
    assert kept["musique_mini"] >= 0.5 and kept["hotpotqa_mini"] >= 0.5, kept


def _musique_rows(n: int) -> list[dict]:
    """`n` MuSiQue-format questions (the hand-made one under n ids; paragraphs as MuSiQue ships them)."""
    paragraphs = [
        {"idx": i, "title": p.title, "paragraph_text": p.text, "is_supporting": p.is_supporting}
        for i, p in enumerate((P_OTHER, P_JOURNAL, P_APA))
    ]
    decomposition = [
        {
            "question": "What company published Journal of Psychotherapy Integration?",
            "answer": "American Psychological Association",
            "paragraph_support_idx": 1,
        },
        {"question": "Who was the first president of #1 ?", "answer": "G. Stanley Hall", "paragraph_support_idx": 2},
    ]
    return [
        {
            "id": f"q{i}",
            "question": MUSIQUE.question,
            "answer": "G. Stanley Hall",
            "answer_aliases": [],
            "paragraphs": paragraphs,
            "question_decomposition": decomposition,
            "answerable": True,
        }
        for i in range(n)
    ]


def test_a_qa_file_warm_starts_on_its_dataset_gt_with_held_out_rl_and_sft_questions_disjoint(tmp_path: Path):
    from trainer_support import TINY

    from pvpo.trainer.config.schema import load_config
    from pvpo.trainer.loop import train

    source = tmp_path / "musique.json"
    source.write_text(json.dumps(_musique_rows(8)))
    cfg = load_config(
        None,
        [
            *TINY,
            f"data.source={source}",
            "data.held_out_examples=2",
            "data.max_train_examples=3",
            "data.warm_start_examples=3",
            "data.shuffle_seed=0",
            "model.warm_start_steps=2",
            "model.warm_start_batch_size=2",
            "rollout.max_turns=3",
            "run.steps=1",
            "run.eval_base=true",
        ],
    )
    searcher = OverlapSearcher(_passages(P_JOURNAL, P_APA, P_OTHER))
    result = train(cfg, tmp_path / "run", searcher=searcher, show_progress=False)
    ws = json.loads((tmp_path / "run" / "warm_start.json").read_text())
    assert len(ws["losses"]) == 2 and ws["dataset_gt"]["written"] == 3
    # run.eval_base: the held-out set evaluated before the warm start too, kept for a resume
    assert result.eval_base["eval/n"] == 2 and len(result.eval_em["base"]) == 2
    assert ws["eval_base"] == result.eval_base and ws["eval_base_em"] == result.eval_em["base"]
    held_file = [json.loads(x) for x in (tmp_path / "run" / "held_out.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in held_file) == sorted(ex.uid for ex in result_held_out(cfg, tmp_path / "run"))
    sft = set(ws["questions"])
    from pvpo.trainer.data import load_data

    data = load_data(cfg, tmp_path / "run")
    rl, held = {ex.uid for ex in data.train}, {ex.uid for ex in data.eval}
    assert len(sft) == 3 and len(rl) == 3 and len(held) == 2
    assert not (sft & rl) and not (sft & held) and not (rl & held)


def test_the_warm_start_computes_in_the_runs_compute_dtype_like_the_update(tmp_path: Path, monkeypatch):
    from trainer_support import TINY

    import pvpo.trainer.model.warmstart as warmstart
    from pvpo.trainer.config.schema import load_config
    from pvpo.trainer.data import load_data
    from pvpo.trainer.setup import prepare_run

    seen: list[tuple[bool, torch.dtype]] = []
    real = warmstart.warm_start

    def recording(*args, **kwargs):
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return real(*args, **kwargs)

    monkeypatch.setattr(warmstart, "warm_start", recording)
    source = tmp_path / "musique.json"
    source.write_text(json.dumps(_musique_rows(6)))
    searcher = OverlapSearcher(_passages(P_JOURNAL, P_APA, P_OTHER))
    for dtype in ("bfloat16", "float32"):
        cfg = load_config(
            None,
            [
                *TINY,
                f"data.source={source}",
                "data.held_out_examples=1",
                "data.max_train_examples=2",
                "data.warm_start_examples=3",
                "model.warm_start_steps=1",
                "model.warm_start_batch_size=2",
                "model.device=cpu",
                f"model.dtype={dtype}",
                "rollout.max_turns=3",
                "run.steps=1",
            ],
        )
        run = tmp_path / f"run_{dtype}"
        run.mkdir()
        prepare_run(cfg, run, load_data(cfg, run), searcher, show_progress=False)
    assert seen == [(True, torch.bfloat16), (False, torch.get_autocast_dtype("cpu"))]


def result_held_out(cfg, run_dir: Path) -> list[QAExample]:
    from pvpo.trainer.data import load_data

    return load_data(cfg, run_dir).eval


def test_the_replay_reuses_the_retrieval_checks_results_each_hop_searched_once(tiny_tokenizer):
    class Counting(OverlapSearcher):
        def __init__(self, passages) -> None:
            super().__init__(passages)
            self.asked: list[str] = []

        def search(self, queries, topk=None):
            self.asked += list(queries)
            return super().search(queries, topk)

    searcher = Counting(_passages(P_JOURNAL, P_APA, P_OTHER, P_NOLAN, P_SATHISH))
    trajs, counts = dataset_trajectories([MUSIQUE, HOTPOT_COMPARISON], tiny_tokenizer, searcher, EpisodeConfig(topk=1))
    assert counts["written"] == 2 and all(t is not None and t.num_tool_calls == 2 for t in trajs)
    assert sorted(searcher.asked) == sorted(
        h.query for p in (musique_plan(MUSIQUE), hotpotqa_plan(HOTPOT_COMPARISON)) for h in p.hops
    )


def test_a_hop_whose_quoted_sentence_the_observation_cuts_is_dropped_and_counted(tiny_tokenizer):
    # Alû's paragraph comes back first, but its supporting sentence (the third) starts at
    # character 49 of the rendered result: a 60-character budget shows "Doc 1(Title: Alû) Alû is
    # a demon. It has no..." and the GT turn would quote a sentence the policy never read.
    class Ranked:
        def search(self, queries, topk=None):
            return [_passages(P_ALU if "Al" in q else P_LILU, P_OTHER)[:topk] for q in queries]

    plan = hotpotqa_plan(HOTPOT_BRIDGE)
    assert plan.hops[1].evidence == ("A Lilu is a spirit in the Akkadian lore.",)
    assert check_retrieval([plan], Ranked(), EpisodeConfig(topk=2, max_obs_chars=60)) == [(2, CUT)]
    assert check_retrieval([plan], Ranked(), EpisodeConfig(topk=2, max_obs_chars=400)) == [None]
    (traj,), counts = dataset_trajectories(
        [HOTPOT_BRIDGE], tiny_tokenizer, Ranked(), EpisodeConfig(max_turns=4, topk=2, max_obs_chars=60)
    )
    assert traj is None and counts[CUT] == 1 and counts[MISSED] == 0 and counts["written"] == 0


def test_musique_hops_quote_their_evidence_and_hops_without_one_check_only_the_paragraph():
    plan = musique_plan(MUSIQUE)
    assert plan.hops[0].evidence == (P_JOURNAL.text,)
    bare = QAExample(  # the hop's answer is in no sentence of its paragraph: nothing is quoted
        "musique/2",
        "Who led it?",
        ("Hall",),
        (P_APA,),
        {"question_decomposition": [{"question": "Who led the APA?", "answer": "Granville Hall", "paragraph": 0}]},
    )
    (hop,) = musique_plan(bare).hops
    assert hop.evidence == () and hop.finding == "The answer to 'Who led the APA' is Granville Hall."

    class Cut:
        def search(self, queries, topk=None):
            return [_passages(P_APA) for _ in queries]

    assert check_retrieval([musique_plan(bare)], Cut(), EpisodeConfig(topk=1, max_obs_chars=20)) == [None]


P_HENRIK = Paragraph(
    "Henrik Selberg", "Henrik Selberg was a Norwegian priest. His father was Ole Michael Ludvigsen Selberg.", True
)
P_OLE = Paragraph(
    "Ole Michael Ludvigsen Selberg (priest)", "Ole Michael Ludvigsen Selberg was born in Flora, Norway.", True
)
TWOWIKI_COMPOSITIONAL = QAExample(
    "2wikimultihopqa/c",
    "What is the place of birth of Henrik Selberg's father?",
    ("Flora",),
    (P_OTHER, P_OLE, P_HENRIK),
    {
        "type": "compositional",
        "supporting_facts": [["Henrik Selberg", 1], ["Ole Michael Ludvigsen Selberg (priest)", 0]],
        "evidences": [
            ["Henrik Selberg", "father", "Ole Michael Ludvigsen Selberg"],
            ["Ole Michael Ludvigsen Selberg", "place of birth", "Flora"],
        ],
        "supporting_sentences": {
            "Henrik Selberg": ["His father was Ole Michael Ludvigsen Selberg."],
            "Ole Michael Ludvigsen Selberg (priest)": ["Ole Michael Ludvigsen Selberg was born in Flora, Norway."],
        },
    },
)
P_MUKAT = Paragraph("Mukat Bhargava", "Mukat Bhargava (30 June 1903 - 18 December 1980) was a politician.", True)
P_LARA = Paragraph("Salvador J. Lara", "Salvador J. Lara (1920 - September 1, 1945) was a soldier.", True)
TWOWIKI_COMPARISON = QAExample(
    "2wikimultihopqa/l",
    "Who lived longer, Mukat Bhargava or Salvador J. Lara?",
    ("Mukat Bhargava",),
    (P_LARA, P_MUKAT),
    {
        "type": "comparison",
        "supporting_facts": [["Mukat Bhargava", 0], ["Salvador J. Lara", 0]],
        "evidences": [
            ["Mukat Bhargava", "date of birth", "30 June 1903"],
            ["Mukat Bhargava", "date of death", "18 December 1980"],
            ["Salvador J. Lara", "date of birth", "1920"],
            ["Salvador J. Lara", "date of death", "September 1, 1945"],
        ],
    },
)


def test_twowiki_bridge_hop_searches_the_name_the_first_hop_read_with_the_titled_plan_as_fallback():
    plan = twowiki_plan(TWOWIKI_COMPOSITIONAL)
    assert [h.query for h in plan.hops] == ["Henrik Selberg", "Ole Michael Ludvigsen Selberg"]
    assert [h.paragraph for h in plan.hops] == [P_HENRIK, P_OLE]
    assert plan.hops[0].finding.endswith("The father of Henrik Selberg is Ole Michael Ludvigsen Selberg.")
    assert plan.hops[1].evidence == ("Ole Michael Ludvigsen Selberg was born in Flora, Norway.",)
    assert plan.answer == "Flora"
    assert plan.fallback is not None and [h.query for h in plan.fallback.hops] == [
        "Henrik Selberg",
        "Ole Michael Ludvigsen Selberg (priest)",
    ]
    assert dataset_plan(TWOWIKI_COMPOSITIONAL) == plan  # the triples win over the HotpotQA-style titles


def test_twowiki_comparison_reads_each_entity_once_stating_all_its_triples():
    plan = twowiki_plan(TWOWIKI_COMPARISON)
    assert [h.query for h in plan.hops] == ["Mukat Bhargava", "Salvador J. Lara"] and plan.fallback is None
    assert "The date of birth of Mukat Bhargava is 30 June 1903." in plan.hops[0].finding
    assert "The date of death of Mukat Bhargava is 18 December 1980." in plan.hops[0].finding
    turns = plan_turns(plan)
    assert turns[-1].endswith("<answer>Mukat Bhargava</answer>") and len(turns) == 3


def test_twowiki_triples_naming_no_supporting_paragraph_have_no_plan():
    bad = QAExample(
        "2wikimultihopqa/x",
        "Who?",
        ("x",),
        (P_MUKAT, P_LARA),
        {"supporting_facts": [["Mukat Bhargava", 0]], "evidences": [["Zeno", "father", "Y"], ["Quux", "mother", "Z"]]},
    )
    with pytest.raises(NoPlan, match="evidence subject 'Zeno' names none"):
        twowiki_plan(bad)


def test_an_engine_with_its_own_weights_is_shut_during_the_warm_start_and_rebuilt_on_its_weights(
    tmp_path: Path, monkeypatch
):
    from trainer_support import TINY

    import pvpo.trainer.model.warmstart as warmstart
    import pvpo.trainer.setup as setup
    from pvpo.trainer.config.schema import load_config
    from pvpo.trainer.data import load_data
    from pvpo.trainer.rollout.hf_engine import HFEngine

    built: list[HFEngine] = []
    closed: list[HFEngine] = []

    class OwnCopy(HFEngine):  # as vLLM: its own copy of the weights
        def close(self) -> None:
            closed.append(self)

    def factory(cfg, tokenizer):
        def make(model):
            built.append(OwnCopy(model, tokenizer, share_weights=False))
            return built[-1]

        return make

    engines_during_sft: list[tuple[int, int]] = []
    real = warmstart.warm_start

    def recording(*args, **kwargs):
        engines_during_sft.append((len(built), len(closed)))
        return real(*args, **kwargs)

    monkeypatch.setattr(setup, "engine_factory", factory)
    monkeypatch.setattr(warmstart, "warm_start", recording)
    source = tmp_path / "musique.json"
    source.write_text(json.dumps(_musique_rows(6)))
    cfg = load_config(
        None,
        [
            *TINY,
            f"data.source={source}",
            "data.held_out_examples=1",
            "data.max_train_examples=2",
            "data.warm_start_examples=3",
            "model.warm_start_steps=2",
            "model.warm_start_batch_size=2",
            "model.warm_start_lr=0.01",
            "model.device=cpu",
            "rollout.max_turns=3",
            "run.steps=1",
        ],
    )
    run = tmp_path / "run"
    run.mkdir()
    searcher = OverlapSearcher(_passages(P_JOURNAL, P_APA, P_OTHER))
    out = setup.prepare_run(cfg, run, load_data(cfg, run), searcher, show_progress=False)
    assert engines_during_sft == [(1, 1)]  # the first engine was shut before the SFT ran
    assert len(built) == 2 and out.engine is built[1] and closed == [built[0]]
    trained, first = out.model.state_dict(), built[0].model.state_dict()
    assert any(not torch.equal(trained[k], first[k]) for k in trained)  # the SFT moved the weights
    assert all(torch.equal(v, out.engine.model.state_dict()[k]) for k, v in trained.items())


def test_an_engine_that_samples_from_the_policy_module_is_kept_through_the_warm_start():
    from pvpo.trainer.policy_engine import owns_weights

    model = torch.nn.Linear(2, 2)

    class Shares:
        def __init__(self, m):
            self.model = m

    assert not owns_weights(Shares(model), model)
    assert owns_weights(Shares(torch.nn.Linear(2, 2)), model)
    assert owns_weights(object(), model)  # vLLM: no module of ours at all
