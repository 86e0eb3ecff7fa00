"""The `/retrieve` wire contract: request limits, the request model (its JSON schema is what the
OpenAPI document publishes, limits included), the reply and error models, and the one-line
messages a 422 carries.

Accepted request fields (anything else is a 422):
- `queries`: list of strings (Search-R1), or `query`: one string (rLLM-style clients); exactly one.
- `topk` (Search-R1; null = the server's default), or its aliases `top_k` / `k`; at most one.
- `return_scores`: bool, default false.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StringConstraints,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from pvpo.retriever.types import MAX_QUERY_CHARS

# At least one character that is not ASCII whitespace. Spelled out because `\s` differs between
# pydantic's Rust regex, Python's `re` and JSON Schema's ECMA dialect (e.g. on \x1c-\x1f), and
# the published schema must accept exactly what the server accepts.
NON_BLANK = r"[^ \t\n\r\x0b\x0c]"


class Limits(BaseModel):
    """What one request may ask for; published in the OpenAPI schema. The largest request,
    1024 queries of 2048 characters, is about 2 minutes of MiniLM on one CPU thread, but it is
    cut into bounded batches that other clients' requests go ahead of (see batching.py), and it
    is dropped when its client disconnects. 2048 characters is more than MiniLM (256 tokens) or
    e5 / bge (512) read of a query."""

    model_config = ConfigDict(extra="forbid")

    max_queries: int = Field(1024, ge=1)
    max_query_chars: int = Field(MAX_QUERY_CHARS, ge=1)
    max_topk: int = Field(100, ge=1)

    @property
    def max_body_bytes(self) -> int:
        """The largest valid body: every character a 12-byte JSON escape (an astral character as
        a surrogate pair) plus quotes and commas, and room for the other fields."""
        return self.max_queries * (self.max_query_chars * 12 + 8) + 4096


def _valid_unicode(q: str) -> str:
    try:
        q.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("is not valid Unicode (lone surrogate)") from None
    return q


def _integral(v: Any) -> Any:
    """2.0 -> 2: JSON Schema's `integer` includes numbers with a zero fraction, so the published
    schema allows them; strings, booleans and 2.5 stay as they are and fail the strict int."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _exclusive(schema: dict[str, Any]) -> None:
    schema["oneOf"] = [{"required": ["queries"]}, {"required": ["query"]}]
    schema["not"] = {
        "anyOf": [{"required": ["topk", "top_k"]}, {"required": ["topk", "k"]}, {"required": ["top_k", "k"]}]
    }


class RetrieveRequestBase(BaseModel):
    """Shared behaviour of the per-limits request models `request_model` builds."""

    if TYPE_CHECKING:  # the fields each built model declares, with its own limits
        queries: list[str] | None
        query: str | None
        topk: int | None
        top_k: int | None
        k: int | None
        return_scores: bool

    def resolved(self, default_topk: int) -> tuple[list[str], int]:
        """(queries, topk) with aliases applied."""
        queries = self.queries if self.queries is not None else [str(self.query)]
        topk = next((v for v in (self.topk, self.top_k, self.k) if v is not None), default_topk)
        return queries, topk

    @model_validator(mode="after")
    def _one_of_each(self) -> RetrieveRequestBase:
        given = self.model_fields_set
        for name in ("queries", "query", "top_k", "k"):
            if name in given and getattr(self, name) is None:
                raise ValueError(f"{name} must not be null")
        if len({"queries", "query"} & given) != 1:
            raise ValueError("give exactly one of `queries` (a list of strings) or `query` (one string)")
        if len(aliases := {"topk", "top_k", "k"} & given) > 1:
            raise ValueError(f"give at most one of topk, top_k, k (they are aliases); got {sorted(aliases)}")
        return self


def request_model(limits: Limits) -> type[RetrieveRequestBase]:
    """The `/retrieve` body model with `limits` as schema constraints."""
    Query = Annotated[
        str,
        StringConstraints(strict=True, min_length=1, max_length=limits.max_query_chars, pattern=NON_BLANK),
        AfterValidator(_valid_unicode),
    ]
    TopK = Annotated[int, Field(strict=True, ge=1, le=limits.max_topk), BeforeValidator(_integral)]
    Queries = Annotated[list[Query], Field(min_length=1, max_length=limits.max_queries)]

    class RetrieveRequest(RetrieveRequestBase):
        model_config = ConfigDict(extra="forbid", json_schema_extra=_exclusive)

        queries: Queries | SkipJsonSchema[None] = Field(
            None, description="the queries, each searched on its own (Search-R1)"
        )
        query: Query | SkipJsonSchema[None] = Field(None, description="one query; same as `queries: [query]`")
        topk: TopK | None = Field(None, description="passages per query; null = the server's default")
        top_k: TopK | SkipJsonSchema[None] = Field(None, description="alias of `topk`")
        k: TopK | SkipJsonSchema[None] = Field(None, description="alias of `topk`")
        return_scores: StrictBool = Field(False, description="add each passage's score")

    return RetrieveRequest


class Document(BaseModel):
    id: str
    contents: str = Field(description='"Title"\\ntext, as in Search-R1\'s corpus')


class Hit(BaseModel):
    document: Document
    score: float | SkipJsonSchema[None] = Field(None, description="present when return_scores is true")


class RetrieveResponse(BaseModel):
    result: list[list[Hit]] = Field(description="one list of passages per query, best first")


class Health(BaseModel):
    status: str
    size: int


class ErrorBody(BaseModel):
    detail: str = Field(description="what is wrong, in one line")


FIELDS = ("queries", "query", "topk", "top_k", "k", "return_scores")


def _where(loc: tuple[Any, ...]) -> str:
    # union members add their own tags to the location (e.g. "none", "constrained-int"): drop them
    parts = [str(x) for x in loc if x in FIELDS or isinstance(x, int)]
    if len(parts) >= 2 and parts[0] == "queries" and parts[1].isdigit():
        return f"queries[{parts[1]}]" + "".join(f".{p}" for p in parts[2:])
    return ".".join(parts) or "body"


def error_messages(errors: list[dict[str, Any]], limits: Limits, at_most: int = 5) -> str:
    """The validation errors of one request as `; `-joined sentences, without the "should be
    None" half of an optional field's error (the value given was not null: that part is noise)."""
    real = [e for e in errors if e.get("type") != "none_required"] or errors
    out: list[str] = []
    for e in real:
        if (msg := error_message(e, limits)) not in out:
            out.append(msg)
    return "; ".join(out[:at_most])


def error_message(err: dict[str, Any], limits: Limits) -> str:
    """One pydantic / FastAPI validation error as a sentence that names the field."""
    kind, loc, ctx, value = err.get("type", ""), tuple(err.get("loc", ())), err.get("ctx") or {}, err.get("input")
    where = _where(loc)
    if kind == "json_invalid":
        pos = next((x for x in loc[1:] if isinstance(x, int)), None)
        at = f" at character {pos}" if pos is not None else ""
        return f"body is not valid JSON{at}: {ctx.get('error', 'decode error')}"
    if where == "queries" and kind == "too_short":
        return "queries must be a non-empty list of strings"
    if where == "queries" and kind == "too_long":
        return f"too many queries: {ctx.get('actual_length')} (at most {limits.max_queries} per request)"
    if kind in ("string_too_short", "string_pattern_mismatch"):
        return f"{where} is empty"
    if kind == "string_too_long":
        return f"{where} is {len(value or '')} characters long (at most {limits.max_query_chars})"
    if kind in ("greater_than_equal", "less_than_equal") and where in ("topk", "top_k", "k"):
        return f"{where} must be between 1 and {limits.max_topk}, got {value}"
    if kind == "extra_forbidden":
        return f"{'.'.join(str(x) for x in loc if x != 'body')}: unknown field (known: {', '.join(FIELDS)})"
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    if kind == "value_error":
        return msg if where == "body" else f"{where} {msg}"
    return f"{where}: {msg}"
