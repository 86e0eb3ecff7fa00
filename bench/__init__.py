"""Benchmarks and the fault table, one folder per subject (bench/README.md). Not part of the package
that ships: run from the repository's root, as `python bench/<subject>/<file>.py`."""
