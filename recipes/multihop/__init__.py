"""The multi-hop recipe's stages after its `pvpo demo` run (docs/recipes/real-smollm2-multihop.md),
as the `pvpo recipe` commands (`cli.py`): RL seeds from the run's warm start (`seeds.py`, its report
`seeds_report.py`), the compute-matched SFT arm (`sft_arm.py`: its step plan `sft_plan.py`, training
`sft_train.py`, reports `sft_report.py`), the held-out and per-type tables (`table.py`,
`by_type.py`) and the dataset GT's coverage (`gt_coverage.py`); what they read from runs (`runs.py`)
and how they run `pvpo eval` once (`evaluate.py`)."""
