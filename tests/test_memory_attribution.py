"""The associative-memory probes, the logit attribution and the ablations, pinned to values computed by hand."""
