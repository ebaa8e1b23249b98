"""TrainService contract: the same assertions for every world."""

from __future__ import annotations

import pytest

from rsigym_env.errors import ActionError
from rsigym_env.services import TrainService
from rsigym_env.tools import Train

from .conftest import small_dataset


def test_is_a_train_service(world):
    assert isinstance(world.train, TrainService)


def test_unknown_dataset_and_checkpoint_are_refused(world):
    with pytest.raises(ActionError) as err:
        world.train.quote(Train(dataset="ds-missing"))
    assert err.value.code == "unknown_ref"
    small_dataset(world)
    with pytest.raises(ActionError) as err:
        world.train.quote(Train(dataset="ds-contract", base="ckpt-missing"))
    assert err.value.code == "unknown_ref"


def test_quote_grows_with_epochs(world):
    small_dataset(world)
    one = world.train.quote(Train(dataset="ds-contract", num_epochs=1))
    three = world.train.quote(Train(dataset="ds-contract", num_epochs=3))
    assert 0 < one.usd < three.usd


@pytest.mark.slow
def test_training_yields_a_servable_checkpoint_billed_within_its_quote(world):
    small_dataset(world)
    call = Train(dataset="ds-contract", num_epochs=1, batch_size=2, learning_rate=1e-3)
    quote = world.train.quote(call)
    job = world.train.start(call, "job-contract", "ckpt-contract")
    billed = job.future.result(timeout=3600)
    assert billed.value.checkpoint == "ckpt-contract" and billed.value.steps == 1
    assert billed.value.tokens > 0 and len(billed.value.loss_curve) == 1
    assert 0 < billed.cost_usd <= quote.usd + 1e-12
    world.chat_model("ckpt-contract")  # now known to inference and evaluation
