"""Every instrument's one-call form reads the documented default prompts."""
