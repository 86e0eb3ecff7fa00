"""The recipes' records: a run timed and measured, RL seeds, the SFT arm, the held-out table, GT coverage."""
