"""The algorithm benchmarks: advantage estimators on the synthetic world and on the real model."""
