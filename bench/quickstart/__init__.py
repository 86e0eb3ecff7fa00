"""The quick start's blocks as a user runs them: time, peak memory and what they report."""
