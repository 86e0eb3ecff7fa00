"""Recipes: what a Trainer is wrapped in to make a result people read (torchtune's split of recipes
from the library). `pvpo demo`'s end-to-end recipe (`demo.py`, its command in `cli.py`: the embedded
world, the run, its plots and summary table), the per-dataset held-out tables (`heldout_table.py`)
and the multi-hop recipe's later stages as `pvpo recipe` commands (`multihop/`: RL seeds, the SFT arm,
its tables). The recipes may use every component; no component imports them (tests/test_import_directions.py)."""

from pvpo.lazy_exports import lazy_exports

_EXPORTS = {
    "run_demo": "demo",
    "per_dataset_table": "heldout_table",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
