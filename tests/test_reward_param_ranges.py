"""A reward parameter outside its range (`floor=5`, `floor=.nan`) is refused where it is given - the
config, `get_reward`, the gym env - naming the key and the range: the reward clamps its total to
[0, 1], so such a floor scored right and wrong answers alike and trained nothing, without a word."""

from __future__ import annotations

import math

import pytest

from pvpo.reward.rewards import PARAM_RANGES, check_reward_params, get_reward
from pvpo.trainer.config.schema import ConfigError, load_config


@pytest.mark.parametrize(
    ("reward", "key", "value", "shown"),
    [
        ("pvpo", "floor", math.nan, "[0, 1], got nan"),
        ("pvpo", "floor", 5, "[0, 1], got 5"),
        ("pvpo", "floor", -0.1, "[0, 1], got -0.1"),
        ("pvpo", "length_ratio", -1.0, "[0, inf), got -1.0"),
        ("pvpo", "length_ratio", math.nan, "[0, inf), got nan"),
        ("research_f1", "floor", 1.5, "[0, 1], got 1.5"),
        ("search_r1_format", "structure_score", math.inf, "[0, 1], got inf"),
        ("search_r1_format", "final_format_score", -1, "[0, 1], got -1"),
    ],
)
def test_a_parameter_outside_its_range_is_refused_naming_the_key_and_the_range(
    reward: str, key: str, value: float, shown: str
) -> None:
    with pytest.raises(
        ValueError, match=rf"parameter '{key}' must be a number in {shown.replace('[', '.').replace(')', '.')}"
    ):
        check_reward_params(reward, {key: value})
    with pytest.raises(ValueError, match=key):
        get_reward(reward, **{key: value})


def test_the_config_refuses_a_floor_of_5_or_nan_at_load() -> None:
    for value in ("5", ".nan"):
        with pytest.raises(ConfigError, match=r"parameter 'floor' must be a number in \[0, 1\]"):
            load_config(None, [f"algorithm.reward_params.floor={value}"])


def test_the_gym_env_refuses_a_floor_out_of_range() -> None:
    import gymnasium

    import pvpo.envs  # noqa: F401 - registers the env

    with pytest.raises(ValueError, match="'floor' must be a number in"):
        gymnasium.make("pvpo/SearchQA-v0", reward_params={"floor": 5.0}, retriever_url="http://127.0.0.1:9")


def test_the_ends_of_every_range_are_accepted() -> None:
    for reward, ranges in PARAM_RANGES.items():
        for key, (low, high) in ranges.items():
            for value in (low, high):
                check_reward_params(reward, {key: value})
