"""InferenceService contract: the same assertions for every world."""

from __future__ import annotations

import pytest

from rsigym_env.errors import ActionError
from rsigym_env.services import InferenceService
from rsigym_env.tools import Infer


def test_is_an_inference_service(world):
    assert isinstance(world.inference, InferenceService)


def test_unknown_checkpoint_is_refused_before_anything_runs(world):
    with pytest.raises(ActionError) as err:
        world.inference.quote(Infer(model="ckpt-does-not-exist", prompt="hi"))
    assert err.value.code == "unknown_ref"


def test_completion_is_billed_at_most_its_quote(world):
    call = Infer(model="base", prompt="What is 2 plus 3?", max_tokens=8)
    quote = world.inference.quote(call)
    assert quote.usd > 0
    billed = world.inference.complete(call)
    assert billed.value.prompt_tokens > 0
    assert 0 <= billed.value.completion_tokens <= 8
    assert billed.value.finish_reason in ("stop", "length")
    assert 0 < billed.cost_usd <= quote.usd + 1e-12
