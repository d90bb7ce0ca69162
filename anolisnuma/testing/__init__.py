"""Helpers for tests: fake kernel trees, a fake CRI backend, a private real containerd."""
