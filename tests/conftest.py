"""Shared fixtures: where the reference data lives, and skipping without it."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"


def shared_file(relative: str) -> Path:
    """Path to a file in ../shared/data, or skip the test naming it."""
    path = SHARED_DATA / relative
    if not path.exists():
        pytest.skip(f"reference data not found: {path}")
    return path


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"reference data not found: {SHARED_DATA}")
    return SHARED_DATA
