"""Head roles in attention-only models and the rank-d KL floor, pinned to values computed by hand."""
