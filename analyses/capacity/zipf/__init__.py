"""Scaling laws of associative memories under Zipf data, and what gradient methods store."""
