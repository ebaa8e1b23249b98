"""EvalService contract: the same assertions for every world."""

from __future__ import annotations

import pytest

from rsigym_env.errors import ActionError
from rsigym_env.services import EvalRequest, EvalService


def _request(world, **kw):
    files = world.initial_harness()
    return EvalRequest(checkpoint=kw.pop("checkpoint", "base"), harness_version="h-0", harness_files=files, **kw)


def test_is_an_eval_service(world):
    assert isinstance(world.evaluation, EvalService)


def test_bad_requests_are_refused_before_anything_runs(world):
    with pytest.raises(ActionError) as err:
        world.evaluation.quote(_request(world, checkpoint="ckpt-missing", k=1, n_tasks=1))
    assert err.value.code == "unknown_ref"
    with pytest.raises(ActionError) as err:
        world.evaluation.start(_request(world, split="official", k=1, n_tasks=1), "job-x")
    assert err.value.code == "not_supported"


def test_quote_is_per_trial(world):
    one = world.evaluation.quote(_request(world, k=1, n_tasks=1))
    three = world.evaluation.quote(_request(world, k=3, n_tasks=1))
    assert 0 < one.usd and three.usd == pytest.approx(3 * one.usd)
