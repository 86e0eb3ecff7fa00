"""`make install` says what it is doing: a numbered line before each stage (pip -q is otherwise silent
for a minute or more), torch from pip's own index unless TORCH_INDEX names another (CI reaches PyPI
only); and building the package prints no setuptools warning (the viewer's assets are package data
of a package that `packages` lists), nor does the editable install (its notice filtered, no other)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def dry_install(tmp_path: Path, *extra: str) -> list[str]:
    """The commands `make install` would run for a venv not yet made (make -n, nothing executed).

    Run as a user runs it, not as a sub-make of `make test`: under CI's make the inherited MAKELEVEL /
    MAKEFLAGS add "make[1]: Entering/Leaving directory" lines (a CI run failed on that)."""
    # never the network in a test: a CPU index that is not there unless the test gives one
    default = (
        []
        if any(e.startswith("TORCH_CPU_INDEX=") for e in extra)
        else [f"TORCH_CPU_INDEX={(tmp_path / 'none').as_uri()}"]
    )
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES")}
    out = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-n",
            "-W",
            "pyproject.toml",
            "install",
            f"VENV={tmp_path / 'venv'}",
            *default,
            *extra,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return out.splitlines()


def test_make_install_prints_a_numbered_line_before_each_stage(tmp_path: Path) -> None:
    lines = dry_install(tmp_path)
    stages = [line for line in lines if re.match(r'echo "make install \[\d/\d\]', line)]
    installs = [i for i, line in enumerate(lines) if " -m pip install " in line or " -m venv " in line]
    assert len(stages) == 5 and len(installs) >= 4
    for i in installs:  # the line just before each stage's command says which stage it is
        assert lines[i - 1].startswith('echo "make install [') or lines[i - 1].startswith("test -x"), lines[i - 1]
    assert lines[-1].startswith('echo "make install: done')


def _cpu_index(root: Path, *wheels: str) -> str:
    """A local simple index (PEP 503) whose torch page links `wheels`, as file:// URL."""
    (root / "torch").mkdir(parents=True)
    links = "".join(f'<a href="{w.replace("+", "%2B")}">{w}</a>\n' for w in wheels)
    (root / "torch" / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    return root.as_uri()


def _torch_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if "pip install" in line and "torch==" in line]


def test_without_a_cuda_driver_torch_is_the_cpu_wheel_where_the_cpu_index_lists_it(tmp_path: Path) -> None:
    if shutil.which("nvidia-smi"):
        pytest.skip("a CUDA machine installs torch as the package's dependency")
    py = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    listing = _cpu_index(tmp_path / "cpu", f"torch-2.13.0+cpu-{py}-{py}-manylinux_2_28_x86_64.whl")
    lines = dry_install(tmp_path, f"TORCH_CPU_INDEX={listing}")
    assert _torch_lines(lines) and all(f"--index-url {listing}" in line for line in _torch_lines(lines))
    assert any(f"from {listing}" in line for line in lines if line.startswith('echo "make install [3/5]'))


def test_torch_comes_from_pips_own_index_where_the_cpu_index_is_unreachable_or_lacks_the_wheel(tmp_path: Path) -> None:
    if shutil.which("nvidia-smi"):
        pytest.skip("a CUDA machine installs torch as the package's dependency")
    other = _cpu_index(tmp_path / "old", "torch-2.1.0+cpu-cp311-cp311-linux_x86_64.whl")  # another version
    for index in ((tmp_path / "missing").as_uri(), other):
        torch_lines = _torch_lines(dry_install(tmp_path, f"TORCH_CPU_INDEX={index}"))
        assert torch_lines and all(
            "--index-url" not in line and "--extra-index-url" not in line for line in torch_lines
        )


def test_a_given_torch_index_is_used_as_given_and_an_empty_one_means_pips_own(tmp_path: Path) -> None:
    if shutil.which("nvidia-smi"):
        pytest.skip("a CUDA machine installs torch as the package's dependency")
    url = "https://download.pytorch.org/whl/cpu"
    chosen = _torch_lines(dry_install(tmp_path, f"TORCH_INDEX={url}"))
    assert chosen and all(f"--index-url {url}" in line for line in chosen)
    plain = _torch_lines(dry_install(tmp_path, "TORCH_INDEX="))
    assert plain and all("--index-url" not in line for line in plain)


@pytest.mark.slow
def test_building_the_package_prints_no_setuptools_warning_and_ships_the_viewer_assets(tmp_path: Path) -> None:
    src = _source_copy(tmp_path)
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        check=False,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    log = build.stdout + build.stderr
    assert "Warning" not in log and "is absent from the `packages`" not in log, log[-3000:]
    [wheel] = wheels.glob("pvpo_search-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {f"pvpo/viewer/assets/{n}" for n in ("view.html", "view.css", "view.js")} <= set(names)


def _source_copy(tmp_path: Path) -> Path:
    """The package's sources copied as the build sees them, so setuptools' build/ and egg-info stay out of the checkout."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    components = [link.name for link in (REPO / "pvpo").iterdir() if link.is_symlink()]  # each one pvpo/ links
    for folder in ("pvpo", *components):
        shutil.copytree(REPO / folder, src / folder, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    return src


@pytest.mark.slow
def test_the_editable_install_hides_setuptools_notice_and_only_it(tmp_path: Path) -> None:
    """`make install`'s editable install runs under the Makefile's EDITABLE_NOTICE filter: without it
    setuptools prints its 9-line "Editable installation" notice, with it nothing."""
    install = next(line for line in dry_install(tmp_path) if " -e " in line)
    found = re.search(r'PYTHONWARNINGS="([^"]+)"', install)
    assert found, f"the editable install runs without the notice's filter: {install}"
    src = _source_copy(tmp_path)

    def editable(env: dict[str, str], prefix: str) -> str:
        # --ignore-installed: without it pip uninstalls this environment's own pvpo-search first
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index"]
        cmd += ["--ignore-installed", "--prefix", str(tmp_path / prefix), "-e", str(src)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env, check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout + done.stderr

    plain = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    purelib = Path(sysconfig.get_paths()["purelib"])
    ours = sorted(purelib.glob("pvpo_search-*.dist-info"))  # this environment's own install, if any
    assert "Editable installation" in editable(plain, "plain")  # what the filter is for
    quiet = editable({**plain, "PYTHONWARNINGS": found.group(1)}, "quiet")
    assert "Warning" not in quiet, quiet[-3000:]
    assert sorted(purelib.glob("pvpo_search-*.dist-info")) == ours  # this environment's install kept
