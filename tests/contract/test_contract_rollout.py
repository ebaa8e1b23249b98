"""RolloutService contract: the same assertions for every world."""

from __future__ import annotations

import pytest

from rsigym_env.errors import ActionError
from rsigym_env.services import RolloutService
from rsigym_env.tools import GenerateData, TransformData

from .conftest import small_dataset


def test_is_a_rollout_service(world):
    assert isinstance(world.rollout, RolloutService)


def test_teachers_outside_the_catalog_and_dev_prompts_are_refused(world):
    with pytest.raises(ActionError) as err:
        world.rollout.quote_generate(GenerateData(teacher="no-such-teacher", n_examples=1))
    assert err.value.code == "unknown_ref"
    teacher = next(iter(world.prices.teachers))
    with pytest.raises(ActionError) as err:
        world.rollout.quote_generate(GenerateData(teacher=teacher, n_examples=1, source="dev"))
    assert err.value.code == "not_supported"


def test_quote_scales_with_examples(world):
    teacher = next(iter(world.prices.teachers))
    one = world.rollout.quote_generate(GenerateData(teacher=teacher, n_examples=1, max_tokens_per_example=256))
    ten = world.rollout.quote_generate(GenerateData(teacher=teacher, n_examples=10, max_tokens_per_example=256))
    assert 0 < one.usd and ten.usd == pytest.approx(10 * one.usd)


def test_filter_keeps_passing_examples(world):
    if world.name == "local":
        from rsigym_env.worlds.local.sandbox.isolation import bwrap_available

        if not bwrap_available():
            pytest.skip("the local sandbox needs bubblewrap here")
    small_dataset(world)
    call = TransformData(operation="filter", datasets=["ds-contract"])
    quote = world.rollout.quote_transform(call)
    billed = world.rollout.transform(call, "ds-filtered")
    assert billed.value.n_examples == 1
    assert billed.cost_usd <= quote.usd + 1e-12
