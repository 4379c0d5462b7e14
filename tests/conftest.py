"""The suite's order: files with end-to-end runs first, then the others by their number of tests.

``make test`` hands whole files to its workers in this order. xdist's own (most tests first) put the two
end-to-end files, minutes each but one to five tests, last, and one worker ran them alone at the end.
"""

from __future__ import annotations

from collections import Counter

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    per_file = Counter(item.path for item in items)
    # a stable sort: each file's tests stay together and in their own order
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None, -per_file[item.path]))
