"""Benchmarks; each is ``python -m bench.<name>`` or ``embedserve bench <name>``."""
