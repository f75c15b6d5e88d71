"""The training machinery every model family shares."""
