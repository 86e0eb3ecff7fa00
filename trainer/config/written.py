"""The config a run writes (`<run>/config.yaml`, what `--resume` reloads): every section, resolved,
and no secret: neither `retriever.token` nor the credentials of `retriever.url`, a comment in
their place saying that one was set (`pvpo.secrets`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from pvpo.atomic import atomic_write_text
from pvpo.secrets import mask_value

if TYPE_CHECKING:
    from pvpo.trainer.config.schema import TrainConfig

# A secret's place in a written config: that one was set, never its value.
TOKEN_NOT_WRITTEN = (
    "# retriever.token was set and is not written here: on --resume give it again "
    "(retriever.token=... or PVPO_RETRIEVER_TOKEN)\n"
)


URL_CREDENTIALS_NOT_WRITTEN = (
    "# retriever.url held credentials, written here as ***: on --resume give retriever.url=... again "
    "(or keep the secret in retriever.token / PVPO_RETRIEVER_TOKEN)\n"
)


def dump_config(cfg: TrainConfig, path: str | Path) -> None:
    """Write the resolved config as YAML (what `--resume` reloads), without the retriever's token
    or the credentials of its URL (`http://user:***@host`): a comment says which was set."""
    data = cfg.model_dump(mode="json")
    had_token = data["retriever"].get("token") is not None
    data["retriever"]["token"] = None
    url = data["retriever"].get("url")
    masked = mask_value("retriever.url", url)
    data["retriever"]["url"] = masked
    text = yaml.safe_dump(data, sort_keys=False)
    head = (TOKEN_NOT_WRITTEN if had_token else "") + (URL_CREDENTIALS_NOT_WRITTEN if masked != url else "")
    atomic_write_text(path, head + text)  # a full disk never leaves half of it
