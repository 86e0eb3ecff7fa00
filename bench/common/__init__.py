"""Shared by every bench: the machine record printed beside each figure."""
