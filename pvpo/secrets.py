"""Secrets are masked wherever a value is echoed - an error message, a log line, a traceback under
`pvpo --debug`, `pvpo config show`, a file a run writes: a bearer token is shown as `***`, and the
credentials of a URL (`http://user:PASSWORD@host`) as `***`, the rest of the URL kept so the message
still says where.

A URL's credentials are found by the parser the HTTP client uses (`httpx.URL`): its authority runs
from `//` to the first `/`, `?` or `#`, and its userinfo is the authority up to the authority's last
`@`, so a password holding `@` (`admin:Secret@4x@host`) is masked whole. A URL httpx cannot parse
(a password holding `/`, `?` or `#`, which must be percent-encoded) is masked from `//` to its last
`@`: more than its credentials, never less. `check_url` refuses such a URL in one masked line."""

from __future__ import annotations

import logging
import re
from typing import Any

MASK = "***"

# config keys whose value is a secret (dotted, as `pvpo config keys` lists them)
SECRET_KEYS = frozenset({"retriever.token"})

_SCHEME = r"[a-zA-Z][a-zA-Z0-9+.-]*://"
# a URL in free text: a scheme, then everything up to a blank or the next URL's scheme
_URL_IN_TEXT = re.compile(rf"\b{_SCHEME}(?:(?!{_SCHEME})\S)*")
_AUTHORITY = re.compile(r"[^/?#]*")  # httpx's (RFC 3986's) authority: up to the first / ? #
_QUOTED = re.compile(r"'[^']*'")

# What to do about a URL httpx refuses whose text has an `@` (credentials, most likely)
PERCENT_ENCODE_HINT = "percent-encode a / ? # @ or : in the user name or password (%2F %3F %23 %40 %3A)"


def _parse(url: str) -> Any:
    """`httpx.URL(url)`, or None where httpx refuses it (imported here: loading a config needs no HTTP client)."""
    import httpx

    try:
        return httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        return None


def _mask_one(url: str) -> str:
    """`url` with its credentials masked: the user kept when a password follows it (it says which
    account, not how to get in), a user part alone masked (often a token, as in `https://<token>@github.com`)."""
    scheme, rest = url.split("://", 1)
    parsed = _parse(url)
    if parsed is None:  # not parseable: everything up to the last @ may be a credential
        at = rest.rfind("@")
    else:
        if not parsed.userinfo:
            return url
        authority = _AUTHORITY.match(rest)
        at = authority.group().rfind("@") if authority else -1
    if at < 0:
        return url
    user, colon, _ = rest[:at].partition(":")
    kept = f"{user}:" if colon and not re.search(r"[/?#@]", user) else ""
    return f"{scheme}://{kept}{MASK}@{rest[at + 1 :]}"


def mask_url(text: str) -> str:
    """`text` with the credentials of every URL in it masked: `http://admin:pw@h` -> `http://admin:***@h`,
    `http://admin:Secret@4x@h` -> `http://admin:***@h`, `https://tok@h` -> `https://***@h`."""
    if "://" not in text:
        return text
    return _URL_IN_TEXT.sub(lambda m: _mask_one(m.group()), text)


def url_problem(url: str) -> str | None:
    """Why the HTTP client cannot send to `url` (httpx's reason, with any part of a credential it
    quotes masked, and the fix), or None where it can."""
    import httpx

    if not isinstance(url, str) or "://" not in url:
        return "not an http(s) URL (give one like http://127.0.0.1:8000)"
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError) as e:
        reason = str(e)
        if "@" in url.split("://", 1)[1]:  # httpx quotes the piece it could not read: part of a password
            return f"{_QUOTED.sub(repr(MASK), reason)}; {PERCENT_ENCODE_HINT}"
        return reason
    if parsed.scheme not in ("http", "https"):
        return f"scheme {parsed.scheme!r} is not http or https"
    if not parsed.host:
        return "it names no host"
    return None


def check_url(url: str, what: str) -> str:
    """`url` if the HTTP client can send to it; else a ValueError of one line naming `what` (the
    option or config key), the URL with its credentials masked, the reason and the fix."""
    problem = url_problem(url)
    if problem is not None:
        raise ValueError(f"{what} {mask_url(str(url))!r} is not a valid URL: {problem}")
    return url


def mask_value(key: str, value: Any) -> Any:
    """`value` as it may be shown for config key `key`: MASK for a set secret, URLs' credentials
    masked in a string, anything else as it is."""
    if key in SECRET_KEYS and value is not None:
        return MASK
    if isinstance(value, str):
        return mask_url(value)
    if isinstance(value, list):
        return [mask_value(key, v) for v in value]
    if isinstance(value, dict):
        return mask_config(value, key)
    return value


def mask_config(data: Any, prefix: str = "") -> Any:
    """A nested config dict (`model_dump(mode="json")`) with every secret masked (`mask_value`)."""
    if isinstance(data, dict):
        return {k: mask_config(v, f"{prefix}.{k}" if prefix else str(k)) for k, v in data.items()}
    return mask_value(prefix, data)


def has_masked_credentials(url: str) -> bool:
    """Whether `url` carries credentials that `mask_url` replaced (read back from a file a run
    wrote): such a URL cannot authenticate."""
    return f":{MASK}@" in url or f"://{MASK}@" in url


def redact(text: str, secrets: Any) -> str:
    """`text` with each of `secrets` (strings, numbers; None skipped) replaced by MASK and URLs'
    credentials masked."""
    for s in secrets if isinstance(secrets, list | tuple | set) else [secrets]:
        if s is not None and str(s):
            text = text.replace(str(s), MASK)
    return mask_url(text)


def mask_exception(err: BaseException) -> BaseException:
    """`err`, and every exception it chains (cause, context, a group's members), with the URL
    credentials in their messages, notes and file names masked in place, so a traceback printed
    under `pvpo --debug` shows none (a 401's `http://u:PW@host/v1/completions failed` included)."""
    seen: set[int] = set()
    stack = [err]
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        e.args = tuple(mask_url(a) if isinstance(a, str) else a for a in e.args)
        for attr in ("filename", "filename2", "strerror"):  # what an OSError shows instead of its args
            value = getattr(e, attr, None)
            if isinstance(value, str):
                setattr(e, attr, mask_url(value))
        notes = getattr(e, "__notes__", None)
        if isinstance(notes, list):
            notes[:] = [mask_url(n) if isinstance(n, str) else n for n in notes]
        stack += [c for c in (e.__cause__, e.__context__) if c is not None]
        stack += list(getattr(e, "exceptions", ()))  # an ExceptionGroup's members
    return err


class _MaskedRecords(logging.Filter):
    """Masks URL credentials in the records of the logger it is added to (httpx logs every request's
    URL at INFO, `http://u:PASSWORD@host/...` as given)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = mask_url(message)
        if masked != message:
            record.msg, record.args = masked, ()
        return True


def mask_logs(name: str = "httpx") -> None:
    """Mask URL credentials in every record logger `name` emits (once per logger)."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, _MaskedRecords) for f in logger.filters):
        logger.addFilter(_MaskedRecords())
