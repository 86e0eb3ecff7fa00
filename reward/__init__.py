"""pvpo.reward: answer normalisation, EM / F1 / cover-EM, tag protocols, trajectory rewards, and the
one scoring layer of every evaluation (`scoring`: a question's scores and their aggregate, one set of
metric names).

Pure functions with no dependency outside the standard library; importing it is cheap.
"""

from pvpo.reward.metrics import (
    TokenScores,
    answer_metrics,
    as_golds,
    cover_exact_match,
    exact_match,
    f1_score,
    precision_score,
    recall_score,
    token_scores,
)
from pvpo.reward.normalize import answer_tokens, normalize_answer
from pvpo.reward.protocol import (
    RESEARCH,
    SEARCH_R1,
    Action,
    ActionKind,
    FormatCheck,
    Segment,
    TagProtocol,
    available_protocols,
    extract_boxed,
    get_protocol,
    register_protocol,
)
from pvpo.reward.rewards import RewardFn, RewardResult, available_rewards, get_reward, register_reward
from pvpo.reward.scoring import QuestionScore, aggregate, answer_in_reach, score_answer

__all__ = [
    "Action",
    "ActionKind",
    "FormatCheck",
    "RESEARCH",
    "RewardFn",
    "RewardResult",
    "SEARCH_R1",
    "QuestionScore",
    "Segment",
    "TagProtocol",
    "TokenScores",
    "aggregate",
    "answer_in_reach",
    "answer_metrics",
    "answer_tokens",
    "as_golds",
    "available_protocols",
    "available_rewards",
    "cover_exact_match",
    "exact_match",
    "extract_boxed",
    "f1_score",
    "get_protocol",
    "get_reward",
    "normalize_answer",
    "precision_score",
    "recall_score",
    "register_protocol",
    "register_reward",
    "score_answer",
    "token_scores",
]
