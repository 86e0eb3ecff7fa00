"""A client for any OpenAI-compatible endpoint (vLLM / SGLang `serve`, OpenAI, ...): requests with
retries, and the turn's text with the stop string the server stripped put back.

The endpoint returns text, not token ids, so it serves evaluation (`pvpo.evaluation.policies`)
and text GT trajectories (`pvpo.trainer.reference.gt_cache`), never token-exact training rollouts.
"""

from __future__ import annotations

import random
import time
from typing import Any

import httpx

from pvpo.reward import TagProtocol
from pvpo.secrets import check_url, mask_logs, mask_url

mask_logs("httpx")  # httpx logs each request's URL at INFO, credentials and all

APIS = ("completions", "chat")
RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


class OpenAIError(RuntimeError):
    """The endpoint refused a request (or kept failing after the retries)."""


class OpenAIClient:
    """POSTs to `<base_url>/completions` or `/chat/completions` with retries (exponential backoff
    with jitter on connection errors, timeouts, 408/409/429/5xx); other errors raise at once with
    the server's message. Thread-safe (one httpx.Client)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout: float = 120.0,
        retries: int = 4,
        backoff: float = 0.5,
    ) -> None:
        self.base_url = check_url(base_url, "endpoint URL").rstrip("/")
        self.model = model
        self.retries, self.backoff = retries, backoff
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(timeout=timeout, headers=headers)
        self.requests = 0

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.base_url}/{path.lstrip('/')}"
        body = {"model": self.model, **body}
        err: str = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1) * (1 + random.random()))
            self.requests += 1
            try:
                r = self.http.post(url, json=body)
            except (httpx.TransportError, httpx.TimeoutException) as e:
                err = f"{type(e).__name__}: {e}"
                continue
            if r.status_code == 200:
                return r.json()
            err = f"HTTP {r.status_code}: {r.text[:300]}"
            if r.status_code not in RETRY_STATUS:
                break
        raise OpenAIError(mask_url(f"{url} failed after {attempt + 1} attempt(s): {err}"))  # logged, shown, kept

    def close(self) -> None:
        self.http.close()


def restore_stop(text: str, finish_reason: str | None, stop_reason: Any, protocol: TagProtocol) -> tuple[str, str]:
    """The turn's text with the stop string the server stripped put back, and why it ended.

    `finish_reason == "length"` -> the token limit. `"stop"`: vLLM names the matched string in
    `stop_reason`; other servers do not, so the stop was the closing tag of the last block the
    turn opened and left open (`<search>` or `<answer>`); with no open block it was EOS."""
    if finish_reason == "length":
        return text, "length"
    stops = protocol.stop_strings
    if isinstance(stop_reason, str) and stop_reason in stops:
        return (text if text.endswith(stop_reason) else text + stop_reason), "stop"
    if any(text.endswith(s) for s in stops):
        return text, "stop"
    best, best_pos = None, -1
    for tag in (protocol.search, protocol.answer):
        pos = text.rfind(protocol.open_tag(tag))
        if pos > best_pos and text.find(protocol.close_tag(tag), pos) == -1:
            best, best_pos = tag, pos
    if best is not None:
        return text + protocol.close_tag(best), "stop"
    return text, "eos"
