"""The canonical JSON helper writes exactly what each hashing call site wrote before it existed."""

from __future__ import annotations

import json

from hypothesis import given, strategies as st

from rsigym_env.canonical import canonical_dumps

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@given(values)
def test_byte_identical_to_the_json_dumps_calls_it_replaced(value):
    assert canonical_dumps(value) == json.dumps(value, sort_keys=True, separators=(",", ":"))
    assert canonical_dumps(value, default=str) == json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    assert canonical_dumps(value, compact=False) == json.dumps(value, sort_keys=True)
    assert canonical_dumps(value, default=str, compact=False) == json.dumps(value, sort_keys=True, default=str)
