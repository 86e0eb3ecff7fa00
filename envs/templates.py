"""Named prompt templates: how an episode's first message is written from a question.

`default` is ours: the protocol's instruction followed by the question. `search_r1` is the exact
instruction Search-R1 (Jin et al., 2025, arXiv:2503.09516) trains with, from its data preparation
(`scripts/data_process/nq_search.py`, `make_prefix`, template "base"), wording, spacing and typo
("as many times as your want") included, with the question stripped and given a trailing "?"
as that script does. Prompts that match the training data make its public checkpoints
(`PeterJinGo/SearchR1-*`) behave as in its paper. Instruct models get the tokenizer's chat
template on top (`model.chat_template: true`), as Search-R1's dataset does.

A template that is not a registered name is used as a format string with the fields
`{instruction}` and `{question}`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pvpo.registry import Registry
from pvpo.reward import TagProtocol


@dataclass(frozen=True)
class PromptTemplate:
    """`text` is formatted with the protocol's tag names (`think`, `search`, `result`, `answer`),
    its `instruction` and the question after `normalize_question`."""

    name: str
    text: str
    normalize_question: Callable[[str], str] = lambda q: q
    protocol: str = "search_r1"  # the tag protocol the template is meant for (its tags come from the one in use)

    @property
    def prompt_template(self) -> str:
        """What `EpisodeConfig.prompt_template` takes to use this template: its name."""
        return self.name

    def render(self, protocol: TagProtocol, question: str) -> str:
        return self.text.format(
            think=protocol.think,
            search=protocol.search,
            result=protocol.result,
            answer=protocol.answer,
            instruction=protocol.instruction(),
            question=self.normalize_question(question),
        )


def _search_r1_question(question: str) -> str:
    q = question.strip()
    return q if q.endswith("?") else q + "?"


DEFAULT = PromptTemplate("default", "{instruction} Question: {question}\n")

SEARCH_R1 = PromptTemplate(
    "search_r1",
    "Answer the given question. "
    "You must conduct reasoning inside <{think}> and </{think}> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by <{search}> query "
    "</{search}> and it will return the top searched results between <{result}> and </{result}>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer inside <{answer}> and "
    "</{answer}>, without detailed illustrations. For example, <{answer}> Beijing </{answer}>. Question: {question}\n",
    _search_r1_question,
)

TEMPLATES: Registry[PromptTemplate] = Registry("prompt template")


def register_template(template: PromptTemplate) -> PromptTemplate:
    """Make a template available by name (to configs: `env.prompt_template`)."""
    return TEMPLATES.register(template.name, template)


for _builtin in (DEFAULT, SEARCH_R1):
    register_template(_builtin)


def available_templates() -> list[str]:
    return TEMPLATES.names()


def get_template(name: str) -> PromptTemplate:
    """A registered template; unknown names raise UnknownNameError listing the known ones."""
    return TEMPLATES.get(name)


def render_prompt(template: str, protocol: TagProtocol, question: str) -> str:
    """The prompt for `question`: `template` is a registered name or a format string with
    `{instruction}` and `{question}`."""
    if template in TEMPLATES:
        return TEMPLATES.get(template).render(protocol, question)
    return template.format(instruction=protocol.instruction(), question=question)
