"""The house's import directions, checked on the source (every `import`, at module level or inside
a function) and, for the config, on what loading a preset actually imports:

    reward  <-  envs  <-  trainer.rollout  <-  trainer ;  trainer.rollout  <-  evaluation
    retriever.client  <-  envs

`reward` imports nothing of ours; `retriever` never imports envs, trainer or evaluation; `envs`
never imports trainer or evaluation; `trainer` never imports evaluation; `trainer.config` imports
no runtime code; each other room of the trainer imports what `ROOMS` lists (README's table).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# What any component may use from the namespace root: the registry type, progress, user errors,
# crash-safe files, folder locks, the machine's native dtypes and spare threads, the folder rule,
# stop signals, secrets' masks, bounded YAML and the statistics helpers (pvpo/*.py, none of which
# imports a component).
ROOT_UTILITIES = {
    "pvpo",
    "pvpo.registry",
    "pvpo.progress",
    "pvpo.user_errors",
    "pvpo.atomic",
    "pvpo.locks",
    "pvpo.hardware",
    "pvpo.owned",
    "pvpo.signals",
    "pvpo.secrets",
    "pvpo.bounded_yaml",
    "pvpo.stats",
    "pvpo.lazy_exports",
    "pvpo.model_catalog",
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["pvpo", *parts])


def _imports(path: Path) -> set[str]:
    """Every `pvpo...` module `path` imports (a `from pvpo.x import y` counts as pvpo.x and, when
    y is a sub-module, pvpo.x.y)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("pvpo")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pvpo") and node.level == 0:
            out.add(node.module)
            for a in node.names:
                candidate = REPO / Path(*node.module.split(".")[1:], a.name)
                if candidate.with_suffix(".py").exists() or (candidate / "__init__.py").exists():
                    out.add(f"{node.module}.{a.name}")
    return out


def _sources(component: str) -> list[Path]:
    return sorted((REPO / component).rglob("*.py"))


def _violations(component: str, allowed: tuple[str, ...]) -> list[str]:
    """`module imports target` for each import of `component`'s files outside `allowed` prefixes
    (a prefix allows itself and its sub-modules) and the root utilities."""
    bad = []
    for path in _sources(component):
        for target in sorted(_imports(path)):
            if target in ROOT_UTILITIES:
                continue
            if not any(target == a or target.startswith(a + ".") for a in allowed):
                bad.append(f"{_module_name(path)} imports {target}")
    return bad


def test_reward_imports_nothing_of_ours() -> None:
    assert _violations("reward", ("pvpo.reward",)) == []


def test_retriever_never_imports_envs_trainer_or_evaluation() -> None:
    assert _violations("retriever", ("pvpo.retriever",)) == []


def test_envs_import_only_reward_and_the_retriever() -> None:
    assert _violations("envs", ("pvpo.envs", "pvpo.reward", "pvpo.retriever")) == []


def test_the_trainer_never_imports_evaluation() -> None:
    bad = [v for path in _sources("trainer") for v in _imports(path) if v.startswith("pvpo.evaluation")]
    assert bad == []


def test_nothing_below_the_recipes_imports_them() -> None:
    # pvpo.recipes wraps a Trainer into results people read (torchtune's split): it may use every
    # component; none of them, nor the viewer, reaches back into it
    components = ("reward", "retriever", "envs", "trainer", "evaluation", "viewer", "integrations")
    bad = [
        f"{_module_name(path)} imports {v}"
        for component in components
        for path in _sources(component)
        for v in _imports(path)
        if v.startswith("pvpo.recipes")
    ]
    assert bad == []


def test_evaluation_reaches_the_trainer_through_rollout_and_the_model_loader_only() -> None:
    allowed = (
        "pvpo.evaluation",
        "pvpo.envs",
        "pvpo.reward",
        "pvpo.retriever",
        "pvpo.trainer.rollout",
        "pvpo.trainer.model.policy",
    )
    assert _violations("evaluation", allowed) == []


def test_algorithms_import_nothing_of_the_trainer_but_the_trajectory() -> None:
    assert _violations("trainer/algorithms", ("pvpo.trainer.algorithms", "pvpo.trainer.rollout.trajectory")) == []


# What each room of trainer/ may import besides itself (README "Architecture", the trainer's table);
# the top-level modules (setup, loop, cli, ...) join the rooms and may import any of them.
OUTSIDE = ("pvpo.reward", "pvpo.envs", "pvpo.retriever")
ROOMS: dict[str, tuple[str, ...]] = {
    "config": (),  # checked on its own below: registries and pure checks only
    "algorithms": ("pvpo.trainer.rollout.trajectory",),
    "rollout": OUTSIDE,
    "model": (
        "pvpo.trainer.config",
        "pvpo.trainer.algorithms",
        "pvpo.trainer.parallel",
        "pvpo.trainer.rollout.trajectory",
        "pvpo.retriever.encoder",  # prompt embeddings for the value model
    ),
    "parallel": ("pvpo.trainer.state", "pvpo.trainer.algorithms.data_parallel", "pvpo.trainer.model.lora"),
    "reference": (
        *OUTSIDE,
        "pvpo.trainer.rollout",
        "pvpo.trainer.parallel",
        "pvpo.trainer.state",
        "pvpo.trainer.model.policy",  # a local model as GT source
    ),
    "state": (
        "pvpo.trainer.config",
        "pvpo.trainer.model.policy",  # a checkpoint's weight files
        # the episode log: the step's rows scored as the reward scores them, written by rank 0
        "pvpo.reward",
        "pvpo.envs.data",
        "pvpo.trainer.rollout.trajectory",
        "pvpo.trainer.parallel.distributed",
    ),
    # held-out scoring and the run's evaluation points, over a narrow view of the run
    "heldout": (
        *OUTSIDE,
        "pvpo.trainer.config",
        "pvpo.trainer.data",
        "pvpo.trainer.model.device",
        "pvpo.trainer.parallel",
        "pvpo.trainer.rollout",
        "pvpo.trainer.state.result",
    ),
    # the step modes: a step's plan and rollouts over the run's data, engine and reference machinery
    "steps": (
        *OUTSIDE,
        "pvpo.trainer.config",
        "pvpo.trainer.data",
        "pvpo.trainer.policy_engine",
        "pvpo.trainer.algorithms",
        "pvpo.trainer.model.device",
        "pvpo.trainer.parallel",
        "pvpo.trainer.reference",
        "pvpo.trainer.rollout",
        "pvpo.trainer.state",
    ),
}


def test_every_room_of_the_trainer_has_an_import_rule() -> None:
    rooms = {p.name for p in (REPO / "trainer").iterdir() if (p / "__init__.py").exists()}
    assert rooms == set(ROOMS)


@pytest.mark.parametrize("room", [r for r in ROOMS if r != "config"])
def test_each_trainer_room_imports_only_what_its_rule_allows(room: str) -> None:
    assert _violations(f"trainer/{room}", (f"pvpo.trainer.{room}", *ROOMS[room])) == []


def test_config_imports_only_registries_and_pure_checks() -> None:
    # the name lists it validates against live in light modules: no estimator, engine or GT source
    # module is imported to check a name, and no torch (see the next test for what loads at run time)
    allowed = (
        "pvpo.trainer.config",
        "pvpo.reward",
        "pvpo.envs.templates",
        "pvpo.retriever.encoder",
        "pvpo.trainer.algorithms.spec",
        "pvpo.trainer.rollout.engine",
        "pvpo.trainer.reference.gt_registry",
    )
    # the pre-flight, which loading a config never imports, also reads the world outside the config:
    # the retriever it asks, the folder rule of an index the run would build, the run files it names,
    # the model folders the run would load
    preflight = (
        "pvpo.retriever.client",
        "pvpo.retriever.outdir",
        "pvpo.trainer.state.run_dir",
        "pvpo.trainer.model.policy",
    )
    bad = _violations("trainer/config", allowed)
    assert [v for v in bad if not (v.startswith("pvpo.trainer.config.preflight ") and v.endswith(preflight))] == []


@pytest.mark.parametrize("preset", ["demo", "smoke", "search_r1_nq_hotpotqa_qwen2.5_3b"])
def test_loading_and_showing_a_preset_imports_no_torch(preset: str) -> None:
    code = (
        "import sys; from pvpo.trainer.config import load_config; "
        "from pvpo.trainer.config.presets import resolve_config; "
        f"cfg = load_config(resolve_config({preset!r}), ['rollout.engine=hf']); cfg.model_dump(mode='json'); "
        "heavy = ('torch', 'transformers', 'faiss', 'sentence_transformers', 'vllm', 'peft'); "
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stderr


def test_nothing_imports_the_integrations_and_they_use_only_public_pieces() -> None:
    # the TRL / verl adapters sit on top: no component imports them, and they reach the trainer only
    # through its exports, the reference files' readers (their formats are the contract) and the
    # rollout room (the one episode driver every caller runs its episodes through)
    users = [
        f"{_module_name(path)} imports {target}"
        for component in ("reward", "retriever", "envs", "trainer", "evaluation")
        for path in _sources(component)
        for target in _imports(path)
        if target.startswith("pvpo.integrations")
    ]
    assert users == []
    allowed = (
        "pvpo.integrations",
        "pvpo.reward",
        "pvpo.envs",
        "pvpo.retriever",
        "pvpo.trainer.reference.anchor",
        "pvpo.trainer.reference.group_sampling",
        "pvpo.trainer.rollout",
    )
    bad = [v for v in _violations("integrations", allowed) if not v.endswith(" imports pvpo.trainer")]
    assert bad == []


def test_the_viewer_reads_what_evaluation_and_training_write_and_nothing_imports_it() -> None:
    # pvpo.viewer sits on top, a reader: the evaluation's item layout, the run dir's names, the episode log
    users = [
        f"{_module_name(path)} imports {target}"
        for component in ("reward", "retriever", "envs", "trainer", "evaluation", "integrations")
        for path in _sources(component)
        for target in _imports(path)
        if target.startswith("pvpo.viewer")
    ]
    assert users == []
    allowed = (
        "pvpo.viewer",
        "pvpo.reward",
        "pvpo.evaluation.run",
        "pvpo.trainer.state.episode_log",
        "pvpo.trainer.state.run_dir",
    )
    assert _violations("viewer", allowed) == []
