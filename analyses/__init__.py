"""Studies a user runs: `python -m analyses.<name> ...` (locate_facts, hallucination, visualize,
report, capacity, tradeoff, aot_capacity; plots, their figures), on the machinery of
analyses/sweeps/ (the sweep engine, the shared command line, atomic output)."""
