"""Tests that need a CUDA device (a package, so its conftest never shadows tests/conftest.py)."""
