"""`pvpo data get`: a named question set's split onto this machine, from the Hugging Face hub or a
local copy, written in FlashRAG's layout (`OUT/<name>/<split>.jsonl`) that every command reads.

The source is FlashRAG's collection (Jin et al., arXiv 2405.13576), the Hugging Face dataset
`RUC-NLPIR/FlashRAG_datasets`, which holds the seven benchmarks of Search-R1's tables (arXiv
2503.09516) as `<name>/<split>.jsonl`, except MuSiQue: FlashRAG's MuSiQue files are too small to
hold its 20 paragraphs a question (5.6 MB for 2,417 dev questions against the raw release's 30.4
MB), so MuSiQue comes as released (Trivedi et al., arXiv 2108.00573), `musique_ans_v1.0_<split>.jsonl`
of the dataset `dgslibisey/MuSiQue`, paragraphs and decomposition included. The loaders read both
formats (`pvpo.envs.loaders`).

Ownership: the command writes only its own files, recorded in `OUT/.pvpo-data.json`; an existing
file is replaced only with `overwrite=True` and only when that record names it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pvpo.atomic import atomic_write_json, atomic_write_text
from pvpo.envs.datasets import benchmark, benchmark_names, check_dataset_name, resolve_dataset, sample_subset
from pvpo.envs.loaders import iter_examples

HUB_REPO = "RUC-NLPIR/FlashRAG_datasets"
# (dataset repository, file name) of a set that does not come from HUB_REPO's `<name>/<split>.jsonl`
SOURCES: dict[str, tuple[str, str]] = {"musique": ("dgslibisey/MuSiQue", "musique_ans_v1.0_{split}.jsonl")}
MANIFEST = ".pvpo-data.json"

# the splits FlashRAG_datasets ships for each benchmark (its dataset card's `configs`)
SPLITS: dict[str, tuple[str, ...]] = {
    "nq": ("train", "dev", "test"),
    "triviaqa": ("train", "dev", "test"),
    "popqa": ("test",),
    "hotpotqa": ("train", "dev"),
    "2wikimultihopqa": ("train", "dev"),
    "musique": ("train", "dev"),
    "bamboogle": ("test",),
}


class DataUnavailableError(ValueError):
    """The set cannot be had from where it was asked: the message is one line, the cause and the fix."""


@dataclass(frozen=True)
class Fetched:
    """What `get` wrote: the file, its questions (of how many in the source) and how many of them
    carry paragraphs (a retriever corpus is built from those: `pvpo data corpus`)."""

    path: Path
    questions: int
    of: int
    with_paragraphs: int
    source: str


def plan(name: str, split: str | None, out: str | Path, folder: str | None = None) -> tuple[str, str, Path]:
    """(benchmark name, split, output file `out/<folder or name>/<split>.jsonl`) for `name`, or a
    ValueError naming the known names or splits; checked before anything is fetched or written."""
    bench = benchmark(name)
    if bench is None:
        raise ValueError(f"no question set named {name!r}: give one of {', '.join(benchmark_names())}")
    split = split or bench.split
    if split not in SPLITS[bench.name]:
        raise ValueError(f"{bench.name} has no {split!r} split: give --split {' or '.join(SPLITS[bench.name])}")
    folder = check_dataset_name(folder, "--name") if folder is not None else bench.name
    return bench.name, split, Path(out) / folder / f"{split}.jsonl"


def _manifest(out: Path) -> dict[str, dict[str, str]]:
    path = out / MANIFEST
    if not path.is_file():
        return {}
    try:
        files = json.loads(path.read_text(encoding="utf-8")).get("files", {})
    except (json.JSONDecodeError, AttributeError):
        raise ValueError(
            f"{path} is not pvpo's record of the files it wrote: move it away, or use another --out"
        ) from None
    return files if isinstance(files, dict) else {}


def check_target(target: Path, out: Path, overwrite: bool) -> None:
    """Refuse a target that exists unless `overwrite` and it is a file this command wrote."""
    if not target.exists():
        return
    key = target.relative_to(out).as_posix()
    if not overwrite:
        raise ValueError(f"{target} exists: pass --overwrite to replace it, or choose another --out")
    if key not in _manifest(out):
        raise ValueError(
            f"{target} was not written by `pvpo data get` ({out / MANIFEST} does not name it): choose another --out"
        )


def source(name: str, split: str) -> tuple[str, str]:
    """(Hugging Face dataset repository, file name in it) of a benchmark's split."""
    repo, pattern = SOURCES.get(name, (HUB_REPO, "{name}/{split}.jsonl"))
    return repo, pattern.format(name=name, split=split)


def hub_file(name: str, split: str) -> Path:
    """The split's file from the Hugging Face hub (through its cache), or DataUnavailableError
    saying why it cannot be had here and how to give a local copy instead."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise DataUnavailableError(
            f"fetching {name} needs huggingface_hub (pip install huggingface_hub), or give a local copy with --from DIR"
        ) from None
    repo, filename = source(name, split)
    hub_log = logging.getLogger("huggingface_hub")
    level = hub_log.level
    hub_log.setLevel(logging.ERROR)  # its retries log a warning each (12 lines over ~25 s with no network)
    try:
        return Path(hf_hub_download(repo, filename, repo_type="dataset"))
    except Exception as err:  # the hub's errors differ by version; the message names the type and what to do
        kind = type(err).__name__
        if kind in ("EntryNotFoundError", "RemoteEntryNotFoundError", "RepositoryNotFoundError"):
            raise DataUnavailableError(f"the Hugging Face hub has no {repo}/{filename} ({kind})") from None
        raise DataUnavailableError(
            f"cannot fetch {repo}/{filename} from the Hugging Face hub ({kind}): no network here, or "
            f"HF_HUB_OFFLINE=1; fetch it where the network allows and pass --from DIR (DIR/{filename})"
        ) from None
    finally:
        hub_log.setLevel(level)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def get(
    name: str,
    out: str | Path,
    *,
    split: str | None = None,
    folder: str | None = None,
    source_dir: str | Path | None = None,
    limit: int | None = None,
    seed: int = 0,
    overwrite: bool = False,
    fetch: Callable[[str, str], Path] = hub_file,
) -> Fetched:
    """Write `name`'s `split` (default: its evaluation split) as `out/<folder or name>/<split>.jsonl`
    (the folder names the questions: their uid prefix and table column), from
    `source_dir` (a local copy in FlashRAG's layout, or flat `<name>.<split>.jsonl`) or else from the
    hub; `limit` questions drawn with `seed` (kept in file order), records unchanged."""
    name, split, target = plan(name, split, out, folder)
    out = Path(out)
    if limit is not None and limit < 1:
        raise ValueError(f"--limit must be at least 1, got {limit}")
    check_target(target, out, overwrite)
    if source_dir is not None:
        if not Path(source_dir).is_dir():
            raise FileNotFoundError(f"--from {source_dir}: no such folder (give a local copy of {HUB_REPO})")
        released = Path(source_dir) / source(name, split)[1]
        src = (
            released
            if name in SOURCES and released.is_file()
            else resolve_dataset(name, split=split, data_dir=source_dir).path
        )
        where = str(src)
    else:
        src = fetch(name, split)
        where = "/".join(source(name, split))
    lines = [line for line in src.read_text(encoding="utf-8").splitlines() if line.strip()]
    kept = sample_subset(lines, limit, seed)
    text = "".join(line + "\n" for line in kept)
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(target, text)
    os.chmod(target, 0o666 & ~_umask())  # a data file others may read, as `open` would make it (mkstemp's is 0600)
    files = _manifest(out)
    files[target.relative_to(out).as_posix()] = {
        "source": where,
        "split": split,
        "limit": str(limit) if limit is not None else "all",
        "seed": str(seed),
        "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
    }
    atomic_write_json(out / MANIFEST, {"files": files}, indent=1, sort_keys=True)
    examples = list(iter_examples(target, name=target.parent.name))
    return Fetched(target, len(kept), len(lines), sum(1 for e in examples if e.paragraphs), where)
