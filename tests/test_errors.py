"""The error tree (embedserve/errors.py): closed, complete, messages kept."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT
from embedserve import errors


def test_error_tree_is_closed_and_messages_are_kept():
    for cls in errors.ALL_ERRORS:
        assert issubclass(cls, errors.EmbedServeError)
        if cls is errors.ModelNotFound:
            missing = cls("boom")
            assert missing.name == "boom" and "`boom`" in missing.message and missing.field == "model"
            continue
        err = cls("boom") if cls is not errors.InputTooLong else cls("boom", index=3, length=900, limit=512)
        assert err.message == "boom"
        assert str(err) == "boom"
    too_long = errors.InputTooLong("x", index=3, length=900, limit=512)
    assert isinstance(too_long, errors.InvalidInput)
    assert (too_long.index, too_long.length, too_long.limit) == (3, 900, 512)


def test_all_errors_holds_every_class_errors_py_defines():
    # ALL_ERRORS is what the transport tables are checked against; it must
    # not be a hand-kept list that a new class can be left out of.
    defined = {value for value in vars(errors).values()
               if isinstance(value, type) and issubclass(value, errors.EmbedServeError)}
    assert set(errors.ALL_ERRORS) == defined
    assert len(errors.ALL_ERRORS) == len(defined)


def test_no_error_class_is_defined_outside_errors_py():
    # ALL_ERRORS sees only the classes errors.py defines; a subclass elsewhere
    # in the package would escape the transport tables' tests.
    names = {cls.__name__ for cls in errors.ALL_ERRORS}
    outside = []
    for path in sorted((ROOT / "embedserve").rglob("*.py")):
        if path.name == "errors.py" and path.parent.name == "embedserve":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(_base_name(base) in names for base in node.bases):
                outside.append(f"{Path(path).relative_to(ROOT)}: {node.name}")
    assert outside == []


def _base_name(base: ast.expr) -> str | None:
    if isinstance(base, ast.Name):
        return base.id
    if isinstance(base, ast.Attribute):
        return base.attr
    return None
