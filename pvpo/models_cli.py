"""`pvpo models list | pull NAME | path NAME`: the model catalog (pvpo/model_catalog.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from pvpo.model_catalog import CATALOG, cache_dir, cached_path, pull

models_app = typer.Typer(help="Named models converted once into the cache ($PVPO_CACHE_DIR), usable as any model path.")


@models_app.command("list")
def list_models() -> None:
    """Catalog names, whether each is converted in the cache, and what it is."""
    typer.echo(f"cache: {cache_dir() / 'models'}")
    for name, entry in CATALOG.items():
        where = cached_path(name)
        state = str(where) if where is not None else f"not pulled (needs: {entry.install_hint})"
        typer.echo(f"{name}\t{entry.description}\t{state}")


@models_app.command("pull")
def pull_model(
    name: Annotated[str, typer.Argument(help="a catalog name (`pvpo models list`) or a *.gguf file")],
    force: Annotated[bool, typer.Option("--force", help="convert again even if a checked copy is cached")] = False,
) -> None:
    """Convert NAME into the cache (once; a cached copy is checked against its sha256s) and print its folder."""
    typer.echo(str(pull(name, force=force, check_hashes=True)))


@models_app.command("path")
def model_path(name: Annotated[str, typer.Argument(help="a catalog name or a *.gguf file")]) -> None:
    """The local folder NAME resolves to (pulled first if needed), for `model.path=$(pvpo models path NAME)`."""
    typer.echo(str(pull(name, check_hashes=False)))


def register(app: typer.Typer) -> None:
    app.add_typer(models_app, name="models")
