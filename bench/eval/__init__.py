"""Evaluation speed: `pvpo eval`'s decoding against the CPU threads it is given."""
