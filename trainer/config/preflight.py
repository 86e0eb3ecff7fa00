"""The pre-flight of a training run: every "can this run" check that the config's validators
cannot make from the config alone (they need the registered estimator, the number of processes,
the machine's GPUs, a folder on disk or the retriever), run by `pvpo train` and `pvpo demo` before
the run folder is made, and by `train()` / `run_demo()` before their first file, so a refusal is
one line (a ValueError naming the key and the fix) before any model is built, any file written or
any evaluation run. What the config alone decides (an estimator with rollouts beside the update or
with Group Sampling, a GT source the data cannot give) is refused when it loads
(`schema.check_staleness_estimator`, `schema.check_group_sampling`).

Loading a config never imports this module, and each check imports what it reads only when the
config asks for it: torch for an estimator's registration (under torchrun) or a CUDA device, the
retriever's client for a `retriever.url`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pvpo.secrets import has_masked_credentials, mask_url

if TYPE_CHECKING:
    from pvpo.trainer.config.schema import TrainConfig

_INDEX_DIR = "retriever.index_dir"


def preflight(cfg: TrainConfig, *, world_size: int | None = None, resume: bool = False, retriever: bool = True) -> None:
    """Refuse, with one line naming the key and the fix, a run of `cfg` that cannot run here:
    `check_device`, `check_estimator`, `check_model_folders` and `check_reuse_from` (a fresh run's),
    `check_index_dir`, `check_retriever`. `world_size`: the processes the run will have
    (`pvpo train --nproc`); None = torchrun's `WORLD_SIZE` in a process it launched, else 1.
    `retriever=False`: the caller brings its own searcher (the configured retriever is not used)."""
    world = world_size if world_size is not None else int(os.environ.get("WORLD_SIZE", "1"))
    check_device(cfg, world)
    check_estimator(cfg, world)
    if not resume:  # a resume reloads its own initial policy and restores its own anchor
        check_model_folders(cfg)
        check_reuse_from(cfg)
    if retriever:
        check_index_dir(cfg)
        check_retriever(cfg)


def check_estimator(cfg: TrainConfig, world_size: int) -> None:
    """Under torchrun the registered estimator (`EstimatorSpec`, a user's own included) must be
    `sharded`: its state learned by every rank (every shipped one is). Its rollouts beside the
    update are the config's check (`schema.check_staleness_estimator`)."""
    if world_size <= 1:
        return  # nothing to ask the registration (which imports torch)
    from pvpo.trainer.algorithms.spec import available_estimators, get_spec

    spec = get_spec(cfg.algorithm.estimator)
    if not spec.sharded:
        sharded = ", ".join(n for n in available_estimators() if get_spec(n).sharded)
        raise ValueError(
            f"algorithm.estimator={spec.name} does not run under torchrun (its state is learned by one "
            f"process): run it without torchrun (--nproc 1), or under torchrun one of {sharded}"
        )


def check_device(cfg: TrainConfig, world_size: int) -> None:
    """`model.device` names a GPU this machine has, and under torchrun each of this machine's
    processes gets a GPU of its own (`cuda:$LOCAL_RANK`) where the run computes on CUDA."""
    name = cfg.model.device
    if not name.startswith("cuda") and not (name == "auto" and world_size > 1):
        return
    if _no_gpu_device_files():  # answered without importing torch: 9.4 s of the refusal on a loaded 2-core machine
        if name.startswith("cuda"):
            raise ValueError(f"model.device={name!r} but CUDA is not available here; use model.device=cpu or auto")
        return  # auto: on CPU
    import torch

    cuda = torch.cuda.is_available()
    if name.startswith("cuda") and not cuda:
        raise ValueError(f"model.device={name!r} but CUDA is not available here; use model.device=cpu or auto")
    if not cuda:
        return  # auto: on CPU
    gpus = torch.cuda.device_count()
    index = int(name.split(":", 1)[1]) if ":" in name else 0
    if index >= gpus:
        raise ValueError(f"model.device={name}: this machine has {gpus} GPU(s), cuda:0 to cuda:{gpus - 1}")
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    if ":" not in name and local > gpus:
        raise ValueError(
            f"{local} processes on this machine but {gpus} GPU(s): give --nproc {gpus} or fewer, or model.device=cpu"
        )


def _no_gpu_device_files() -> bool:
    """On Linux, whether the machine has none of the device files a GPU driver makes (NVIDIA's
    control device, ROCm's kfd, WSL's dxg): then no torch build sees a GPU."""
    gpu_files = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")
    return sys.platform == "linux" and not any(os.path.exists(f) for f in gpu_files)


def check_model_folders(cfg: TrainConfig) -> None:
    """`model.path`, and `algorithm.gt.model.path` where Group Sampling's GT comes from it, when a
    local folder, holds a config, weights and a tokenizer (`model.policy.check_model_folder`): the
    run loads them after its corpus is written and its index built. Catalog names and hub ids are
    resolved by the loader."""
    from pvpo.model_catalog import is_catalog_model
    from pvpo.trainer.model.policy import check_model_folder

    alg = cfg.algorithm
    gt_model = alg.gt.model.path if alg.group_sampling.enabled and alg.gt.source == "model" else None
    for path in (cfg.model.path, gt_model):
        if path and not is_catalog_model(path):
            check_model_folder(path)


def check_reuse_from(cfg: TrainConfig) -> None:
    """`algorithm.anchor.reuse_from` names a run that built an anchor (whether it covers this run's
    RL prompts is known once they are loaded: `reference/reuse.py`)."""
    source = cfg.algorithm.anchor.reuse_from
    if source is None:
        return
    from pvpo.trainer.state.run_dir import RunDir

    if not RunDir(source).anchor.is_file():
        raise ValueError(f"algorithm.anchor.reuse_from={source}: no anchor.json there; give a run that built one")


def check_index_dir(cfg: TrainConfig) -> None:
    """A `retriever.index_dir` the run would build an index in (it holds no `meta.json`) must be a
    folder `pvpo retriever build` could build in - new, empty, or an interrupted build of pvpo's
    (`retriever.outdir.check_build_target`); a user's data folder is a ValueError naming it, never
    rewritten. A built index is only read."""
    if cfg.retriever.url or not cfg.retriever.index_dir:
        return  # the run's own <run>/index: a name its manifest reserves
    index_dir = Path(cfg.retriever.index_dir)
    if (index_dir / "meta.json").is_file():
        return
    from pvpo.retriever.outdir import check_build_target

    check_build_target(index_dir, what=_INDEX_DIR)


def check_retriever(cfg: TrainConfig) -> None:
    """Each `retriever.url` answers one search (with the run's token): a server that is not there,
    refuses the token or is no /retrieve server is refused now, not at the run's first search.
    One attempt per URL (the run's own client retries; a pre-flight that retried would only delay
    the refusal), within `retriever.timeout`."""
    r = cfg.retriever
    if not r.url:
        return
    urls = [r.url] if isinstance(r.url, str) else list(r.url)
    if any(has_masked_credentials(u) for u in urls):
        raise ValueError(
            "retriever.url: its credentials are not in the run's config.yaml (written as ***): "
            "give retriever.url=... again on --resume, or keep the secret in PVPO_RETRIEVER_TOKEN"
        )
    from pvpo.retriever.client import RetrieverClient, RetrieverError

    token = r.token or os.environ.get("PVPO_RETRIEVER_TOKEN") or None
    for url in urls:
        with RetrieverClient(url, topk=1, timeout=r.timeout, retries=0, token=token) as client:
            try:
                client.search(["pre-flight"], topk=1)
            except RetrieverError as e:
                if e.status_code in (401, 403):
                    fix = "check the token (retriever.token or PVPO_RETRIEVER_TOKEN)"
                else:
                    fix = (
                        e.fix or "start one (pvpo retriever serve --index DIR --port N) or give the right retriever.url"
                    )
                cause = " ".join(str(e).split())  # one line, whatever the server answered
                raise ValueError(f"retriever.url={mask_url(url)}: {cause}; {fix}") from None
