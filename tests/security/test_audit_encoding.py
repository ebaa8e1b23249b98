"""Auditing never raises, whatever the researcher sends.

``audit_args``, ``tool_label``, ``Platform.refuse``, ``Platform.record`` and ``canonical_json`` take
any Python value: nested deeper than the recursion limit, huge, self-referencing, not JSON at all,
ints beyond 64 bits (and beyond what ``str()`` will print), NaN and infinities, bytes, lone
surrogates, objects whose ``__repr__``/``__str__`` raise, dict and str subclasses that raise, keys of
mixed types. The record is stored, bounded, and the chain verifies.

Before the fix an action nested 5000 levels deep made ``step`` raise ``RecursionError`` from the
audit encoder, unaudited.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from collections import OrderedDict, deque
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rsigym_env.errors import ActionError
from rsigym_env.platform.audit import AUDIT_MAX_DEPTH, AUDIT_MAX_NODES, canonical_json, summarize, verify_audit
from rsigym_env.platform.core import Platform, audit_args, tool_label
from rsigym_env.platform.ledger import Ledger
from rsigym_env.scenario import load_scenario

RECORD_MAX_CHARS = 200_000  # AUDIT_MAX_NODES values of at most ~300 characters each, with room


class RaisingRepr:
    def __repr__(self) -> str:
        raise RuntimeError("repr")

    def __str__(self) -> str:
        raise ValueError("str")


class RaisingDict(dict):
    def items(self):  # type: ignore[override]
        raise RuntimeError("items")

    def get(self, *args: Any) -> Any:
        raise RuntimeError("get")

    def __iter__(self):  # type: ignore[override]
        raise RuntimeError("iter")


class RaisingStr(str):
    def __getitem__(self, i: Any) -> Any:
        raise RuntimeError("getitem")

    def __str__(self) -> str:
        raise RuntimeError("str")


class RaisingClass:
    @property  # type: ignore[misc]
    def __class__(self) -> Any:
        raise RuntimeError("class")


class HugeStr:
    def __str__(self) -> str:
        return "x" * 5_000_000


class BadKey:
    def __eq__(self, other: object) -> bool:
        raise RuntimeError("eq")

    def __hash__(self) -> int:
        return 7_777_777  # unlike any other key's here, so building the dict never compares it

    def __str__(self) -> str:
        raise RuntimeError("str")


def nested(depth: int, kind: str) -> Any:
    """A value ``depth`` containers deep, built without recursion."""
    value: Any = "bottom"
    for i in range(depth):
        if kind == "list" or (kind == "mixed" and i % 3 == 0):
            value = [value]
        elif kind == "dict" or (kind == "mixed" and i % 3 == 1):
            value = {"k": value, 1: None}
        else:
            value = (value, 1.5)
    return value


def loops() -> list[Any]:
    d: dict[Any, Any] = {"a": 1}
    d["self"] = d
    lst: list[Any] = [1]
    lst.append(lst)
    both: dict[Any, Any] = {"l": lst}
    lst.append(both)
    wide: dict[Any, Any] = {}
    for i in range(50):
        wide[i] = wide  # 50 edges back to itself at every level
    return [d, lst, both, wide]


HOSTILE: dict[str, Any] = {
    "deep list 5000": nested(5000, "list"),
    "deep dict 5000": nested(5000, "dict"),
    "deep mixed 100000": nested(100_000, "mixed"),
    "deep tuple 50000": nested(50_000, "tuple"),  # orjson 3.13 overflows the C stack on these
    "deep mixed in a list": [nested(100_000, "mixed")],
    "self dict": loops()[0], "self list": loops()[1], "loop through both": loops()[2], "wide loop": loops()[3],
    "huge list": list(range(1_000_000)),
    "huge dict": {i: str(i) for i in range(100_000)},
    "huge set": set(range(200_000)),
    "huge deque": deque(range(100_000)),
    "huge str": "y" * 10_000_000,
    "huge bytes": b"\x00" * 1_000_000,
    "bytearray": bytearray(b"abc"), "memoryview": memoryview(b"xyz"),
    "int 2**64": 2**64, "int -2**300": -(2**300), "int beyond str()": 10**5000,
    "nan": math.nan, "inf": [math.inf, -math.inf], "lone surrogates": "\ud800x\udfff" * 200,
    "raising repr": RaisingRepr(), "raising dict": RaisingDict(a=1), "raising str": RaisingStr("abc"),
    "raising __class__": RaisingClass(), "huge __str__": HugeStr(),
    "mixed keys": {1: "a", "b": 2, None: 3, 2.5: 4, (1, 2): 5, RaisingRepr(): 6, BadKey(): 7, b"k": 8, True: 9},  # noqa: F601 (True and 1: one key, as in Python)
    "mapping proxy": MappingProxyType({"a": [1, 2]}), "ordered": OrderedDict(b=1, a=2),
    "generator": (i for i in range(10)), "type": type, "function": print, "module": sys,
    "exception": ValueError("x" * 1000),
}


@pytest.fixture(scope="module")
def platform() -> Any:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ledger.sqlite"
        p = Platform(Ledger(path))
        p.key = p.issue_key(load_scenario(budget_usd=10))
        yield p
        p.ledger.close()


def refuse_and_check(platform: Platform, action: Any) -> dict[str, Any]:
    """refuse() and record() the action; both records stored, bounded, plain JSON; the chain verifies."""
    before = platform.ledger.audit_head()[0]
    started = time.perf_counter()
    platform.refuse(platform.key, action, ActionError("invalid_args", "bad"))
    platform.record(platform.key, action, note=action)
    took = time.perf_counter() - started
    records = platform.ledger.audit_records()[before:]
    assert [r.seq for r in records] == [before + 1, before + 2]
    refused, recorded = (r.event for r in records)
    assert refused["decision"] == "refused" and refused["code"] == "invalid_args" and refused["op"] == "record"
    assert recorded["decision"] == "allowed" and recorded["tool"] == refused["tool"]
    assert isinstance(refused["tool"], str) and len(refused["tool"]) <= 64
    text = canonical_json(refused)
    assert len(text) < RECORD_MAX_CHARS, len(text)
    assert json.loads(text) == json.loads(canonical_json(json.loads(text)))  # plain JSON, stable
    report = verify_audit(platform.ledger.path)
    assert report.ok, str(report)
    assert took < 5.0  # bounded work
    assert len(canonical_json(recorded)) < 2 * RECORD_MAX_CHARS
    return refused


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_values_are_audited(platform: Platform, name: str) -> None:
    value = HOSTILE[name]
    for action in (value, {"tool": "train", "args": value}, {"tool": value, "args": {"x": value}}):
        started = time.perf_counter()
        args = audit_args(action)
        assert time.perf_counter() - started < 1.0  # bounded: no walk over a million items
        assert isinstance(args, dict) and len(canonical_json(args)) < RECORD_MAX_CHARS
        assert isinstance(tool_label(action), str)
        refuse_and_check(platform, action)
    event = {"seq": 1, "key": "k", "value": value}
    text = canonical_json(event)
    assert json.loads(text)["seq"] == 1 and json.loads(text)["key"] == "k"


SURVIVES = """
import sys
sys.path.insert(0, sys.argv[1])
from test_audit_encoding import nested
from rsigym_env.platform.audit import canonical_json
from rsigym_env.platform.core import audit_args
def deeper(n, f):  # some Python frames below, as in a server
    return f() if n == 0 else deeper(n - 1, f)
for kind, n in (("tuple", 50_000), ("mixed", 100_000), ("list", 100_000)):
    value = [nested(n, kind)]
    deeper(300, lambda: canonical_json({"seq": 1, "key": None, "value": value}))
    deeper(300, lambda: audit_args({"tool": "train", "args": value}))
print("alive")
"""


def test_the_process_survives_deep_tuples() -> None:
    """Deep tuples are never handed to orjson, which would kill the process (not raise)."""
    import subprocess

    proc = subprocess.run([sys.executable, "-c", SURVIVES, str(Path(__file__).parent)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "alive", (proc.returncode, proc.stderr[-2000:])


def test_the_generator_was_not_consumed() -> None:
    gen = (i for i in range(3))
    audit_args({"tool": "x", "args": gen})
    assert list(gen) == [0, 1, 2]


def test_bounds_are_marked() -> None:
    args = audit_args({"tool": "train", "args": {"deep": nested(50, "list"), "many": list(range(10_000))}})
    text = json.dumps(args)
    assert "<truncated: depth>" in text and "more items>" in text
    assert text.count("[") <= AUDIT_MAX_DEPTH + 2
    assert len(args["args"]["many"]) <= AUDIT_MAX_NODES
    loop: dict[str, Any] = {}
    loop["me"] = loop
    assert summarize(loop) == {"me": "<truncated: cycle>"}
    assert summarize(10**5000).startswith("<int: 16610 bits sha256:")
    assert summarize(RaisingRepr()) == "<unprintable RaisingRepr>"
    assert summarize({1: 1, "1": 2}) == {"1": 2}  # keys as JSON writes them; the later one wins


def test_a_deeply_nested_action_is_a_refused_step_not_an_exception(tmp_path: Path) -> None:
    import gymnasium as gym

    import rsigym_env  # noqa: F401

    env = gym.make("RSIGym/Joint-v0", world="sim", benchmark="aime", budget_usd=50, ledger_path=tmp_path / "l.sqlite")
    env.reset(seed=0)
    for action in (nested(5000, "list"), {"tool": "train", "args": nested(5000, "dict")}, loops()[0],
                   {"tool": "evaluate", "args": {"k": 10**5000}}):
        obs, reward, terminated, truncated, info = env.step(action)
        assert info["ok"] is False and reward == 0 and isinstance(info["error"], str)
    records = env.unwrapped.platform.ledger.audit_records()
    env.close()
    assert [r.event["decision"] for r in records] == ["refused"] * 4
    assert verify_audit(tmp_path / "l.sqlite").ok


# --- property: anything hypothesis can build ---------------------------------------------------------

texts = st.text(st.characters(codec=None, exclude_categories=()), max_size=300)  # lone surrogates included
huge_ints = st.sampled_from([63, 64, 1000, 5000]).map(lambda e: 10**e)  # 10**5000: beyond what str() prints
scalars = (st.none() | st.booleans() | st.integers() | huge_ints
           | st.floats(allow_nan=True, allow_infinity=True) | texts | st.binary(max_size=64))
keys = texts | st.integers() | st.none() | st.floats(allow_nan=True) | st.booleans()
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(keys, inner, max_size=6)
    | st.tuples(inner, inner) | st.frozensets(st.integers() | texts, max_size=4),
    max_leaves=60,
)
deep = st.builds(nested, st.integers(1, 3000), st.sampled_from(["list", "dict", "tuple", "mixed"]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(value=values | deep, wrap=st.sampled_from(["bare", "args", "tool"]))
def test_refuse_never_raises(platform: Platform, value: Any, wrap: str) -> None:
    action = {"bare": value, "args": {"tool": "train", "args": value}, "tool": {"tool": value, "args": value}}[wrap]
    event = refuse_and_check(platform, action)
    assert isinstance(event["args"], dict)
