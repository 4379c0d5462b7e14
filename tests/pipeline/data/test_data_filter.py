"""The token-length filter."""

from __future__ import annotations

import pytest

from pipeline.data.filter import LengthFilter
from pipeline.errors import UserError


def test_reasons():
    length_filter = LengthFilter(min_length=2, max_length=10, max_length_ratio=2.0)
    assert length_filter.reason(5, 6) is None
    assert length_filter.reason(1, 6) == "too_short"
    assert length_filter.reason(5, 11) == "too_long"
    assert length_filter.reason(3, 7) == "ratio"
    assert LengthFilter(max_length=10).reason(1, 10) is None


@pytest.mark.parametrize(
    "kwargs", [{"min_length": 0}, {"min_length": 5, "max_length": 4}, {"max_length_ratio": 0.5}]
)
def test_bad_limits_are_user_errors(kwargs):
    with pytest.raises(UserError):
        LengthFilter(**kwargs)
