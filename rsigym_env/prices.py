"""Price lists: target model (Tinker), teacher models, sandbox compute (E2B).

The defaults are the rates RSIGym used (see ``../shared/REFERENCE.md``): Qwen3.5-35B-A3B-Base on
Tinker, three teacher models, E2B's per-vCPU-second and per-GiB-second rates.

>>> p = DEFAULT_PRICES
>>> round(p.train_usd(1_000_000), 3)
1.177
>>> round(p.teacher_usd("claude-opus-5", 1_000_000, 1_000_000), 2)
30.0
"""

from __future__ import annotations

from typing import Any, Mapping

from pydantic import BaseModel, Field

PER_M = 1e-6


class ModelPrice(BaseModel):
    """Dollars per million tokens for the target model."""

    prefill: float
    cached: float
    sample: float
    train: float


class TeacherPrice(BaseModel):
    """Dollars per million input / output tokens for a teacher model."""

    input: float
    output: float


class SandboxPrice(BaseModel):
    """Sandbox compute rates."""

    vcpu_second: float = 0.000014
    gib_second: float = 0.0000045


class PriceList(BaseModel):
    """Every rate a run is billed at."""

    model: str
    model_price: ModelPrice
    teachers: dict[str, TeacherPrice]
    sandbox: SandboxPrice = Field(default_factory=SandboxPrice)
    source: str = ""

    def train_usd(self, tokens: float) -> float:
        return tokens * self.model_price.train * PER_M

    def sample_usd(self, prompt_tokens: float, completion_tokens: float) -> float:
        return (prompt_tokens * self.model_price.prefill + completion_tokens * self.model_price.sample) * PER_M

    def sample_usd_cached(self, prompt_tokens: float, cached_tokens: float, completion_tokens: float) -> float:
        """Like :meth:`sample_usd`, with ``cached_tokens`` of the prompt at the cached-prefill rate.

        >>> DEFAULT_PRICES.sample_usd_cached(1_000_000, 1_000_000, 0) < DEFAULT_PRICES.sample_usd(1_000_000, 0)
        True
        """
        cached = min(max(cached_tokens, 0.0), prompt_tokens)
        return ((prompt_tokens - cached) * self.model_price.prefill + cached * self.model_price.cached
                + completion_tokens * self.model_price.sample) * PER_M

    def teacher_usd(self, teacher: str, input_tokens: float, output_tokens: float) -> float:
        price = self.teachers[teacher]
        return (input_tokens * price.input + output_tokens * price.output) * PER_M

    def sandbox_usd(self, seconds: float, vcpus: float = 2.0, memory_gib: float = 2.0) -> float:
        return seconds * (vcpus * self.sandbox.vcpu_second + memory_gib * self.sandbox.gib_second)


DEFAULT_PRICES = PriceList(
    model="Qwen3.5-35B-A3B-Base",
    model_price=ModelPrice(prefill=0.54, cached=0.108, sample=1.335, train=1.177),
    teachers={
        "claude-opus-5": TeacherPrice(input=5.0, output=25.0),
        "gpt-6-astra": TeacherPrice(input=10.0, output=50.0),
        "deepseek-v4.1-flash": TeacherPrice(input=0.30, output=1.20),
    },
    source="RSIGym price list (Tinker Qwen3.5-35B-A3B-Base, teacher catalog, E2B), November 2026",
)


def parse_usd(value: Any) -> float:
    """A price as Tinker's ``models.json`` writes it (``"$1.335"``) or a number, in dollars.

    >>> parse_usd("$1,335.5"), parse_usd(0.54)
    (1335.5, 0.54)
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        number = float(value.strip().removeprefix("$").replace(",", ""))
    else:
        raise ValueError(f"not a price: {value!r}")
    if number < 0:
        raise ValueError(f"a price cannot be negative: {value!r}")
    return number


def model_price_from_tinker(row: Mapping[str, Any], cached_fraction: float = 0.2) -> ModelPrice:
    """A :class:`ModelPrice` from one row of Tinker's ``models.json`` (``prefill``, ``sample``, ``train`` and,
    where listed, ``cached_prefill``; without it the cached rate is ``cached_fraction`` of prefill, Tinker's rule).

    >>> model_price_from_tinker({"tinker_id": "Qwen/Qwen3.5-35B-A3B-Base", "prefill": "$0.54",
    ...                          "cached_prefill": "$0.108", "sample": "$1.335", "train": "$1.177"})
    ModelPrice(prefill=0.54, cached=0.108, sample=1.335, train=1.177)
    """
    prefill = parse_usd(row["prefill"])
    cached = parse_usd(row["cached_prefill"]) if row.get("cached_prefill") not in (None, "") else prefill * cached_fraction
    return ModelPrice(prefill=prefill, cached=round(cached, 6), sample=parse_usd(row["sample"]),
                      train=parse_usd(row["train"]))
