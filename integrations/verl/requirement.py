"""What the adapter says when verl is not installed: which extra installs it, and where."""

from __future__ import annotations

INSTALL = "pip install 'pvpo-search[verl]'"


def verl_missing(err: ModuleNotFoundError, what: str) -> ModuleNotFoundError:
    """The error `what` (a module or function of the adapter) raises when `import verl` (or a
    module verl needs, e.g. cachetools) failed with `err`: the install command, in a venv of its
    own since verl 0.9 pins transformers < 5.11."""
    return ModuleNotFoundError(
        f"{what} needs verl, which is not installed here (no module named {err.name!r}): "
        f"{INSTALL} in a venv of its own (verl 0.9 needs transformers < 5.11; `make test-verl` builds one)",
        name=err.name,
    )
