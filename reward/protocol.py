"""Tag protocols: which tags a search agent writes, and how its text is read and judged.

One `TagProtocol` object is shared by the environment (to read the agent's actions and wrap
observations) and by the rewards (to extract the answer and judge the format), so the two can
never disagree. Pure text, no dependencies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property

from pvpo.registry import Registry


class ActionKind(str, Enum):
    """What one agent turn asks the environment to do."""

    SEARCH = "search"
    ANSWER = "answer"
    INVALID = "invalid"


@dataclass(frozen=True)
class Action:
    """One parsed agent turn: a search query, a final answer, or an invalid turn."""

    kind: ActionKind
    content: str = ""


@dataclass(frozen=True)
class Segment:
    """A piece of a response: a tag block (`tag` set) or free text between blocks (`tag` None)."""

    tag: str | None
    content: str
    closed: bool = True


@dataclass(frozen=True)
class FormatCheck:
    """Whether a whole response follows the protocol, and if not, the first reason why."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


_BOXED = "\\boxed{"


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` in `text` (braces balanced), or None if there is none."""
    start = text.rfind(_BOXED)
    while start != -1:
        depth, i = 1, start + len(_BOXED)
        while i < len(text):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start + len(_BOXED) : i].strip()
            i += 1
        start = text.rfind(_BOXED, 0, start)  # unbalanced: try an earlier one
    return None


@dataclass(frozen=True)
class TagProtocol:
    """Names the tags of a search-agent protocol and owns parsing, answers, format and observations.

    `strict=True` also requires that nothing but whitespace stands outside the tag blocks and
    that the response starts with a think block (Search-R1's `is_valid_sequence`).
    `boxed_answer=True` reads the answer from `\\boxed{}` inside the answer block (ReSearch).
    """

    name: str = "custom"
    think: str = "think"
    search: str = "search"
    result: str = "information"
    answer: str = "answer"
    boxed_answer: bool = False
    strict: bool = False
    invalid_message: str = field(default="")

    def __post_init__(self) -> None:
        tags = [self.think, self.search, self.result, self.answer]
        for tag in tags:
            if not tag or not re.fullmatch(r"[A-Za-z_][\w\-]*", tag):
                raise ValueError(f"tag names must be identifiers, got {tag!r}")
        if len(set(tags)) != 4:
            raise ValueError(f"the four tags must differ, got {tags}")

    # ---- tag text -------------------------------------------------------------------------
    @staticmethod
    def open_tag(tag: str) -> str:
        return f"<{tag}>"

    @staticmethod
    def close_tag(tag: str) -> str:
        return f"</{tag}>"

    @property
    def stop_strings(self) -> tuple[str, str]:
        """Where generation of one turn stops: the end of a search or of the answer."""
        return (self.close_tag(self.search), self.close_tag(self.answer))

    @cached_property
    def _tag_re(self) -> re.Pattern[str]:
        names = "|".join(re.escape(t) for t in (self.think, self.search, self.result, self.answer))
        return re.compile(rf"<(/?)({names})>")

    # ---- parsing --------------------------------------------------------------------------
    def segments(self, text: str) -> list[Segment]:
        """Split `text` into tag blocks and free text. Result blocks are opaque: tags inside a
        retrieved passage are not read. A stray closing tag or a block opened inside another
        makes a `Segment(tag="!error", ...)` carrying the reason."""
        if not isinstance(text, str):
            return []
        out: list[Segment] = []
        pos = 0
        while pos < len(text):
            m = self._tag_re.search(text, pos)
            if m is None:
                out.append(Segment(None, text[pos:]))
                break
            if m.start() > pos:
                out.append(Segment(None, text[pos : m.start()]))
            closing, tag = m.group(1) == "/", m.group(2)
            if closing:
                out.append(Segment("!error", f"stray {self.close_tag(tag)}"))
                pos = m.end()
                continue
            end_tag = self.close_tag(tag)
            if tag == self.result:
                end = text.find(end_tag, m.end())
                inner_end = end
            else:
                nxt = self._tag_re.search(text, m.end())
                if nxt is not None and not (nxt.group(1) == "/" and nxt.group(2) == tag):
                    out.append(Segment("!error", f"{nxt.group(0)} inside {self.open_tag(tag)}"))
                    pos = nxt.start() if nxt.group(1) != "/" else nxt.end()
                    continue
                end = nxt.start() if nxt is not None else -1
                inner_end = end
            if end == -1:
                out.append(Segment(tag, text[m.end() :], closed=False))
                break
            out.append(Segment(tag, text[m.end() : inner_end]))
            pos = end + len(end_tag)
        return out

    def parse_action(self, turn: str) -> Action:
        """Read one agent turn: its first complete search or answer block decides the action."""
        for seg in self.segments(turn):
            if not seg.closed:
                continue
            if seg.tag == self.search:
                query = seg.content.strip()
                return Action(ActionKind.SEARCH, query) if query else Action(ActionKind.INVALID)
            if seg.tag == self.answer:
                answer = self._answer_text(seg.content)
                return Action(ActionKind.ANSWER, answer) if answer is not None else Action(ActionKind.INVALID)
        return Action(ActionKind.INVALID)

    def _answer_text(self, block: str) -> str | None:
        if self.boxed_answer:
            return extract_boxed(block)
        return block.strip()

    def extract_answer(self, text: str) -> str | None:
        """The final answer: the content of the last closed answer block (its `\\boxed{}` for
        boxed protocols), stripped; None if there is none."""
        for seg in reversed(self.segments(text)):
            if seg.tag == self.answer and seg.closed:
                return self._answer_text(seg.content)
        return None

    def check_format(self, response: str) -> FormatCheck:
        """Judge a whole response (agent text with the env's result blocks inside): tags balanced
        and not nested, every search followed by its result block and every result block by a
        search, exactly one answer block, nothing after it."""
        if not isinstance(response, str):
            return FormatCheck(False, "response is not text")
        segs = self.segments(response)
        blocks = [s for s in segs if s.tag is not None]
        for s in segs:
            if s.tag == "!error":
                return FormatCheck(False, s.content)
            if not s.closed:
                return FormatCheck(False, f"unclosed {self.open_tag(s.tag or '')}")
            if s.tag is None and self.strict and s.content.strip():
                return FormatCheck(False, "text outside tags")
        answers = [i for i, b in enumerate(blocks) if b.tag == self.answer]
        if len(answers) != 1:
            return FormatCheck(False, f"{len(answers)} answer blocks, expected 1")
        answer_block = blocks[answers[0]]
        after = segs[segs.index(answer_block) + 1 :]
        if any(s.tag is not None or s.content.strip() for s in after):
            return FormatCheck(False, "text after the answer")
        if self._answer_text(answer_block.content) in (None, ""):
            return FormatCheck(False, "empty answer" if not self.boxed_answer else "answer without \\boxed{}")
        for i, b in enumerate(blocks):
            if b.tag == self.search:
                if i + 1 >= len(blocks) or blocks[i + 1].tag != self.result:
                    return FormatCheck(False, f"{self.open_tag(self.search)} without its {self.open_tag(self.result)}")
                if not b.content.strip():
                    return FormatCheck(False, "empty search query")
            if b.tag == self.result and (i == 0 or blocks[i - 1].tag != self.search):
                return FormatCheck(False, f"{self.open_tag(self.result)} without a search before it")
        if self.strict and (not blocks or blocks[0].tag != self.think):
            return FormatCheck(False, f"response must start with {self.open_tag(self.think)}")
        return FormatCheck(True)

    # ---- environment text -----------------------------------------------------------------
    def wrap_observation(self, text: str) -> str:
        """The result block the env appends after a search."""
        return f"\n\n{self.open_tag(self.result)}{text}{self.close_tag(self.result)}\n\n"

    def correction_message(self) -> str:
        """What the env says after a turn with no valid search or answer."""
        if self.invalid_message:
            return self.invalid_message
        s, a = self.search, self.answer
        boxed = " as \\boxed{answer}" if self.boxed_answer else ""
        return (
            f"\nMy previous action is invalid. If I want to search, I should put the query between "
            f"<{s}> and </{s}>. If I want to give the final answer, I should put the answer between "
            f"<{a}> and </{a}>{boxed}. Let me try again.\n"
        )

    def instruction(self) -> str:
        """The prompt text that teaches a model this protocol (Search-R1's wording, our tags)."""
        t, s, r, a = self.think, self.search, self.result, self.answer
        example = "\\boxed{Beijing}" if self.boxed_answer else "Beijing"
        return (
            f"Answer the given question. You must conduct reasoning inside <{t}> and </{t}> first every "
            f"time you get new information. After reasoning, if you find you lack some knowledge, you can "
            f"call a search engine by <{s}> query </{s}> and it will return the top searched results "
            f"between <{r}> and </{r}>. You can search as many times as you want. If you find no further "
            f"external knowledge needed, you can directly provide the answer inside <{a}> and </{a}>, "
            f"without detailed illustrations. For example, <{a}> {example} </{a}>."
        )


SEARCH_R1 = TagProtocol(name="search_r1")
"""Search-R1 (Jin et al., 2025): think / search / information / answer."""

RESEARCH = TagProtocol(name="research", result="result", boxed_answer=True)
"""ReSearch (Chen et al., 2025): think / search / result / answer, answer in `\\boxed{}`."""

PROTOCOLS: Registry[TagProtocol] = Registry("tag protocol")


def register_protocol(protocol: TagProtocol) -> TagProtocol:
    """Make a custom protocol available by name to `get_protocol` (and so to configs)."""
    return PROTOCOLS.register(protocol.name, protocol)


for _builtin in (SEARCH_R1, RESEARCH):
    register_protocol(_builtin)


def get_protocol(name: str) -> TagProtocol:
    """A registered protocol by name; unknown names raise UnknownNameError listing the known ones."""
    return PROTOCOLS.get(name)


def available_protocols() -> list[str]:
    return PROTOCOLS.names()
