"""The shipped YAML presets (`configs/*.yaml`, installed as package data of `pvpo.configs`), found
through the installed package, never relative to a source tree; `--config` takes a path or a
preset's name."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

PRESETS_PACKAGE = "pvpo.configs"


def _preset_dir() -> Path:
    try:
        return Path(str(resources.files(PRESETS_PACKAGE)))
    except ModuleNotFoundError:
        raise FileNotFoundError(
            f"the package {PRESETS_PACKAGE} is not installed: reinstall pvpo-search "
            "(`pip install .`, or `pip install -e .` in a checkout)"
        ) from None


def available_presets() -> list[str]:
    """Names of the shipped presets (e.g. demo, smoke)."""
    return sorted(p.stem for p in _preset_dir().glob("*.yaml"))


def preset_path(name: str) -> Path:
    """The shipped preset `name` (`demo`, or `demo.yaml`); FileNotFoundError listing the presets
    when there is none of that name."""
    path = _preset_dir() / (name if name.endswith(".yaml") else f"{name}.yaml")
    if not path.is_file():
        raise FileNotFoundError(f"no preset {name!r}: the shipped presets are {available_presets()}")
    return path


def resolve_config(config: str | Path) -> Path:
    """A `--config` value as a file: an existing path, else a shipped preset of that name
    (`demo`, `smoke.yaml`); FileNotFoundError naming both when it is neither."""
    path = Path(config)
    if path.is_file():
        return path
    if path.parent == Path("."):  # a bare name (which may hold dots: search_r1_..._qwen2.5_3b)
        try:
            return preset_path(path.name)
        except FileNotFoundError:
            pass
    raise FileNotFoundError(f"config {str(config)!r} is neither a file nor a shipped preset ({available_presets()})")
