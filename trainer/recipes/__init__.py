"""What a run is wrapped in to make a result people read: `pvpo demo`'s end-to-end recipe
(`demo.py`: the embedded world, the run, its plots and summary table) and the per-dataset
held-out tables (`heldout_table.py`) that recipes and benchmarks print."""
