"""Studies a user runs: `python -m analyses.<name> ...`."""
