"""The fault table: probes grouped by what they probe, and the runner for all (`run.py`)."""
