"""onceonly."""
