"""Helpers for tests and benchmarks only: random-weight models built locally (no hub). No module
of the runtime package imports this folder (tests/test_layers.py checks it)."""
