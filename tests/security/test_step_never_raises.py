"""Issue 11, item 6: ``step`` never raises, whatever the action; every refusal is audited and free.

Attacked as a researcher (or a broken LLM client) would: actions nested thousands of levels deep,
huge, self-referencing, of every type, as objects and as JSON text. A property test drives
nesting, size and type extremes through ``step`` on an on-disk ledger whose audit chain must
verify afterwards.
"""

from __future__ import annotations

import json
import math

import gymnasium as gym
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rsigym_env  # noqa: F401
from rsigym_env.platform.audit import verify_audit
from rsigym_env.tools import TOOL_NAMES

leaves = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**200), max_value=2**200),
                   st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=50), st.binary(max_size=20),
                   st.sampled_from([math.nan, math.inf, -0.0, 2**70, "", "\x00", "\udcff"]))
values = st.recursive(leaves, lambda inner: st.one_of(st.lists(inner, max_size=5), st.tuples(inner, inner),
                                                       st.dictionaries(st.one_of(st.text(max_size=8), st.integers()),
                                                                       inner, max_size=5)), max_leaves=40)
actions = st.one_of(
    values,
    st.fixed_dictionaries({"tool": st.one_of(st.sampled_from(TOOL_NAMES), values), "args": values}),
    st.builds(lambda name, args: json.dumps({"tool": name, "args": args}, default=repr),
              st.sampled_from(TOOL_NAMES), values),
)


def deep(n: int, leaf: object = 1) -> object:
    for _ in range(n):
        leaf = {"a": [leaf]}
    return leaf


def cyclic() -> dict:
    d: dict = {"tool": "read"}
    d["args"] = d
    return d


EXTREMES = [deep(5000), {"tool": "read", "args": deep(5000)}, {"tool": "edit_harness", "args": {"path": deep(300)}},
            "[" * 200_000 + "]" * 200_000, '{"a": [' * 900 + "1" + "]}" * 900, cyclic(), [1] * 1_000_000,
            {"tool": "read", "args": {"ref": "x" * 5_000_000}}, "x" * 3_000_000, b"\xff\xfe" * 100,
            (np.int64(99), {}), (3, {"k": np.array([1, 2])}), object(), float("nan"), {"tool": None, "args": None},
            {"tool": "submit", "args": {"checkpoint": {"nested": True}}}, {"tool": "read", "args": {"ref": "\x00" * 10}},
            {"tool": "wait", "args": {"timeout_s": float("inf")}}, {"tool": "wait", "args": {"timeout_s": -1}},
            {"tool": "evaluate", "args": {"k": 2**100}}]


def check_refusal_is_free(env, action, balance_before):
    obs, reward, terminated, truncated, info = env.step(action)
    assert isinstance(obs["log"], str) and set(obs) == set(env.observation_space.spaces)
    if not info["ok"]:
        assert info["cost_usd"] == 0.0 and info["error"], info
    return info


def test_extremes_are_refused_and_audited(tmp_path):
    ledger = tmp_path / "ledger.sqlite"
    env = gym.make("RSIGym/Joint-v0", world="sim", benchmark="aime", budget_usd=100, ledger_path=ledger, max_steps=10_000)
    env.reset(seed=0)
    before = env.unwrapped.platform.ledger.audit_head()[0]
    for action in EXTREMES:
        info = check_refusal_is_free(env, action, None)
        assert not info["ok"] and info["error"] in ("malformed_action", "invalid_args", "unknown_tool", "unknown_ref"), (type(action), info)
    after = env.unwrapped.platform.ledger.audit_head()[0]
    assert after - before == len(EXTREMES)  # one audit record per refusal
    env.close()
    assert verify_audit(ledger).ok


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(batch=st.lists(actions, min_size=1, max_size=8))
def test_step_takes_anything(tmp_path_factory, batch):
    ledger = tmp_path_factory.mktemp("fuzz") / "ledger.sqlite"
    env = gym.make("RSIGym/Joint-v0", world="sim", benchmark="aime", budget_usd=50, ledger_path=ledger, max_steps=1000)
    env.reset(seed=1)
    for action in batch:
        check_refusal_is_free(env, action, None)
    bal = env.unwrapped.run.balance
    assert 0.0 <= bal.spent_usd <= bal.budget_usd and bal.available_usd >= 0.0
    env.close()
    assert verify_audit(ledger).ok
