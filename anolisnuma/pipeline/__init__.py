"""Interception pipeline: decode → pre-hooks → forward → post-hooks, for a few CRI methods."""
