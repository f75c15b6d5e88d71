"""The machinery every study runs on: the sweep engine, its executors, the shared command line
and atomic output."""
