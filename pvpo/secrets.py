"""Secrets are masked wherever a value is echoed - an error message, a log line, `pvpo config
show`, a file a run writes: a bearer token is shown as `***`, and the password of a URL
(`http://user:PASSWORD@host`) as `***`, the rest of the URL kept so the message still says where."""

from __future__ import annotations

import re
from typing import Any

MASK = "***"

# config keys whose value is a secret (dotted, as `pvpo config keys` lists them)
SECRET_KEYS = frozenset({"retriever.token"})

# scheme://user:password@ (the user kept: it says which account, not how to get in)
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*):(?P<password>[^/\s@]*)@")
# scheme://token@ (a user part alone is often a token, as in https://<token>@github.com)
_URL_USER = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^/\s:@]+)@")


def mask_url(text: str) -> str:
    """`text` with the credentials of every URL in it masked: `http://admin:pw@h` -> `http://admin:***@h`,
    `https://tok@h` -> `https://***@h`."""
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}:{MASK}@", text)
    return _URL_USER.sub(lambda m: f"{m['head']}{MASK}@", text)


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
