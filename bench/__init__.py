"""Benchmarks, run from the repository root: ``python -m bench <name>`` (see bench/__main__.py)."""
