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
