"""Policies: pure decisions, no I/O."""
