"""The factual-recall family (Nichani, Lee & Bietti 2024): its configs and presets, weights,
trainer, constructions, associative memories and pruning."""
