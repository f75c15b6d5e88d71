"""Activation patching, the hallucination phases and their detection, pinned to values computed by hand."""
