"""An installed wheel (not editable) ships the presets: `pvpo demo` resolves the
same demo config as the checkout, and a missing preset is an error, never the built-in defaults."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pvpo.cli import app
from pvpo.trainer.config.presets import available_presets, preset_path, resolve_config
from pvpo.trainer.config.schema import load_config

REPO = Path(__file__).resolve().parents[1]
RESOLVE = (
    "import json, pvpo; from pvpo.trainer.config.presets import preset_path; from pvpo.trainer.config.schema import load_config; "
    "print(json.dumps({'pvpo': pvpo.__file__, 'demo': load_config(preset_path('demo')).model_dump(mode='json')}))"
)


def test_presets_are_the_checkouts_configs_files() -> None:
    assert {"demo", "smoke"} <= set(available_presets())
    assert preset_path("demo").read_bytes() == (REPO / "configs" / "demo.yaml").read_bytes()
    assert resolve_config("smoke") == preset_path("smoke")


def test_a_missing_config_or_preset_is_an_error_naming_the_presets(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no preset 'nope': the shipped presets are \[.*'demo'"):
        preset_path("nope")
    res = CliRunner().invoke(app, ["demo", "--config", "nope", "--run-dir", str(tmp_path / "r")])
    assert res.exit_code == 2 and "neither a file nor a shipped preset" in res.output and "'demo'" in res.output
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_the_installed_wheel_resolves_the_same_demo_config_as_the_checkout(tmp_path: Path) -> None:
    # a copy of what the wheel is built from, so setuptools' build/ and egg-info stay out of the checkout
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for folder in ("pvpo", "reward", "retriever", "envs", "trainer", "configs"):
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src)],
        check=True,
        timeout=300,
        cwd=tmp_path,
    )
    [wheel] = wheels.glob("pvpo_search-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", str(wheel)],
        check=True,
        timeout=300,
    )
    # the dependencies come from this environment's site-packages (a path, so its editable pvpo finder is not run)
    site = next(Path(p) for p in sys.path if p.endswith("site-packages"))
    fresh_site = next((venv / "lib").glob("python*/site-packages"))
    (fresh_site / "deps.pth").write_text(str(site) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [str(py), "-c", RESOLVE], check=True, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
    ).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert Path(got["pvpo"]).is_relative_to(venv), got["pvpo"]  # the wheel's copy, not the checkout
    assert got["demo"] == load_config(REPO / "configs" / "demo.yaml").model_dump(mode="json")
    env |= {"COLUMNS": "200", "TERM": "dumb", "NO_COLOR": "1"}
    helps = [
        subprocess.run([str(exe), "demo", "--help"], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
        for exe in (venv / "bin" / "pvpo", Path(sys.executable).parent / "pvpo")
    ]
    assert [h.returncode for h in helps] == [0, 0], helps[0].stderr
    assert helps[0].stdout == helps[1].stdout and "demo preset shipped with the package" in helps[0].stdout
