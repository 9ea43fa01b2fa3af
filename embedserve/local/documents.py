"""What makes a row a document, and why a row is not one.

One rule for every reader (JSON Lines, CSV, Parquet, plain text, Ray's
batches): a document's text is a non-empty string. A row that fails is not
an error of the job: it gets a reason, goes to the errors file and the run
goes on. The reasons are fixed strings (plus the field name) so that they
can be counted and grepped.
"""

from __future__ import annotations

from typing import Any

MISSING = "missing field"
NOT_TEXT = "not text"
EMPTY = "empty text"
NOT_JSON = "not valid JSON"
NOT_OBJECT = "not a JSON object"
TOO_LONG = "too long"


def text_problem(value: Any, field: str) -> str | None:
    """None when ``value`` is a usable text, else why the row is skipped."""
    if value is None:
        return f"{MISSING} {field!r}"
    if not isinstance(value, str):
        return f"{NOT_TEXT}: field {field!r} is {type(value).__name__}"
    if value == "":
        return EMPTY
    return None


def too_long(length: int, limit: int) -> str:
    return f"{TOO_LONG}: {length} tokens, the model takes at most {limit}"
