"""The seven QA benchmarks of Search-R1 / ReSearch / PVPO tables by name: which FlashRAG jsonl file
holds a dataset's evaluation split, and a reproducible subset of it.

FlashRAG_datasets (huggingface.co/datasets/RUC-NLPIR/FlashRAG_datasets) ships `<name>/<split>.jsonl`;
a flat folder of `<name>.<split>.jsonl` files (as `../shared/data/flashrag`) is read too. Search-R1
(arXiv:2503.09516, Table 2) evaluates NQ, TriviaQA, PopQA and Bamboogle on `test`, HotpotQA, 2Wiki
and MuSiQue on `dev` (they have no public test answers): those are the default splits here.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pvpo.envs.loaders import dataset_name_for

DATA_DIR_ENV = "PVPO_DATA_DIR"

T = TypeVar("T")


@dataclass(frozen=True)
class Benchmark:
    """A benchmark's FlashRAG folder name, its column title in tables and its evaluation split."""

    name: str
    title: str
    split: str
    aliases: tuple[str, ...] = ()


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("nq", "NQ", "test", ("natural_questions",)),
    Benchmark("triviaqa", "TriviaQA", "test", ("tq", "trivia_qa")),
    Benchmark("popqa", "PopQA", "test"),
    Benchmark("hotpotqa", "HotpotQA", "dev", ("hotpot",)),
    Benchmark("2wikimultihopqa", "2Wiki", "dev", ("2wiki", "2wikimqa", "2wikimultihop")),
    Benchmark("musique", "MuSiQue", "dev"),
    Benchmark("bamboogle", "Bamboogle", "test"),
)
_BY_NAME = {n: b for b in BENCHMARKS for n in (b.name, *b.aliases)}


def benchmark(name: str) -> Benchmark | None:
    """The benchmark called `name` (or one of its aliases, any case); None when it is not one of the seven."""
    return _BY_NAME.get(name.strip().lower())


def benchmark_names() -> list[str]:
    return [b.name for b in BENCHMARKS]


def default_data_dir() -> Path | None:
    """`$PVPO_DATA_DIR` when set."""
    value = os.environ.get(DATA_DIR_ENV)
    return Path(value) if value else None


@dataclass(frozen=True)
class ResolvedDataset:
    """Where one evaluation's questions come from: the dataset name (uid prefix, table column),
    its split and the file."""

    name: str
    split: str
    path: Path


def resolve_dataset(
    name_or_path: str, *, split: str | None = None, data_dir: str | Path | None = None
) -> ResolvedDataset:
    """A benchmark name (`nq`, `2wiki`, ...) resolved to its FlashRAG jsonl file in `data_dir`
    (default `$PVPO_DATA_DIR`), or an existing file path taken as is, named as the environment
    names its questions (`loaders.dataset_name_for`: `hotpotqa_mini/questions.json` -> `hotpotqa_mini`).
    `split` defaults to the benchmark's evaluation split. Errors name what was looked for."""
    path = Path(name_or_path)
    if path.is_file():
        file_split = path.name.split(".")[1] if path.name.count(".") >= 2 else path.stem
        return ResolvedDataset(dataset_name_for(path), split or file_split, path)
    bench = benchmark(name_or_path)
    if bench is None:
        raise FileNotFoundError(
            f"dataset {name_or_path!r} is neither a file nor a known benchmark; known: {benchmark_names()}"
        )
    split = split or bench.split
    root = Path(data_dir) if data_dir is not None else default_data_dir()
    if root is None:
        raise FileNotFoundError(
            f"dataset {bench.name!r} given by name needs a data folder: pass --data-dir or set ${DATA_DIR_ENV} "
            f"(FlashRAG layout {bench.name}/{split}.jsonl, or {bench.name}.{split}.jsonl)"
        )
    names = (bench.name, *bench.aliases)
    candidates = [root / n / f"{split}.jsonl" for n in names] + [root / f"{n}.{split}.jsonl" for n in names]
    for c in candidates:
        if c.is_file():
            return ResolvedDataset(bench.name, split, c)
    raise FileNotFoundError(
        f"no {split} split of {bench.name!r} under {root}: looked for {[str(c) for c in candidates[:2]]}"
    )


# a dataset's name becomes a folder under `pvpo eval --out` and its uids' prefix
_NAME_BYTES = 200


def check_dataset_name(name: str, source: object) -> str:
    """`name` when it can name a dataset (a folder name of its own and a uid prefix: not empty, no
    `/` or control character, not hidden, at most 200 bytes); a ValueError naming `source` and the
    fix otherwise."""
    bad = (
        not name.strip()
        or "/" in name
        or any(ord(c) < 32 for c in name)
        or name.startswith(".")
        or len(name.encode("utf-8", "surrogateescape")) > _NAME_BYTES
    )
    if bad:
        raise ValueError(
            f"dataset name {name!r} (of {source}) cannot name a results folder (empty, a '/' or a control "
            "character, hidden, or over "
            f"{_NAME_BYTES} bytes): give it a name with --name"
        )
    return name


def name_datasets(datasets: Sequence[ResolvedDataset], names: Sequence[str] = ()) -> list[ResolvedDataset]:
    """`datasets` renamed by `names` (`pvpo eval --name`, one per dataset in order, or none), each
    name checked (`check_dataset_name`) and no two sharing one - their results would share a
    folder and their uids a prefix: a ValueError naming both, before anything is loaded."""
    if names and len(names) != len(datasets):
        raise ValueError(
            f"--name given {len(names)} time(s) for {len(datasets)} --dataset(s): give one per dataset, in order"
        )
    out = (
        [ResolvedDataset(n, d.split, d.path) for d, n in zip(datasets, names, strict=True)] if names else list(datasets)
    )
    seen: dict[str, ResolvedDataset] = {}
    for d in out:
        check_dataset_name(d.name, d.path)
        if d.name in seen:
            first = seen[d.name]
            same = first.path.resolve() == d.path.resolve() and first.split == d.split
            raise ValueError(
                f"{first.path} is given twice: drop one --dataset"
                if same
                else f"{first.path} and {d.path} are both named {d.name!r} (their results would share one folder): "
                "give each its own with --name, one per --dataset in order"
            )
        seen[d.name] = d
    return out


def sample_subset(items: Sequence[T], limit: int | None, seed: int | None) -> list[T]:
    """`limit` items of `items`: the first ones when `seed` is None, else a uniform draw without
    replacement with `random.Random(seed)` (the same subset on every machine), kept in file order.
    All items when `limit` is None or not below their number."""
    if limit is None or limit >= len(items):
        return list(items)
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if seed is None:
        return list(items[:limit])
    chosen = sorted(random.Random(seed).sample(range(len(items)), limit))
    return [items[i] for i in chosen]
