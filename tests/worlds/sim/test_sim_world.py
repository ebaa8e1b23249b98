"""The sim world: determinism, calibration to the paper, the effects the model must show, and billing."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsigym_env.errors import ActionError
from rsigym_env.services import (
    EvalRequest,
    EvalService,
    InferenceService,
    RolloutService,
    SandboxService,
    TrainService,
    World,
)
from rsigym_env.tools import GenerateData, Infer, SandboxExec, Train, TransformData
from rsigym_env.worlds.sim import BENCHMARKS, SimClock, SimOptions, SimWorld
from rsigym_env.worlds.sim.benchmarks import DEFECTS
from rsigym_env.worlds.sim.model import FAILURE_MODES, truncated_mean_tokens

FIXES = {
    "truncated_output": ('on_truncation = "stop"', 'on_truncation = "continue"'),
    "unverified_completion": ("verify_before_submit = false", "verify_before_submit = true"),
    "lost_shell_state": ("persistent = false", "persistent = true"),
    "action_loop": ("detect = false", "detect = true"),
    "unchecked_edit": ("check = false", "check = true"),
}
RELEVANT = {
    "swe-bench-verified": set(DEFECTS),
    "terminal-bench-2": set(DEFECTS),
    "skillsbench": set(DEFECTS),
    "aime": {"truncated_output", "unverified_completion"},
    "gpqa-diamond": set(),
}


def harness(world: SimWorld, *defects: str) -> dict[str, str]:
    """The initial harness with the given defects fixed."""
    files = world.initial_harness()
    text = files["harness.toml"]
    for defect in defects:
        old, new = FIXES[defect]
        text = text.replace(old, new)
    return {**files, "harness.toml": text}


def present(world: SimWorld) -> list[str]:
    """The defects this seed's target system has."""
    return [d for d, has in zip(DEFECTS, world.profile.present) if has]


def fixed(world: SimWorld) -> dict[str, str]:
    """The initial harness with exactly the system's defects fixed (what a good diagnosis gives)."""
    return harness(world, *present(world))


def seed_where(benchmark: str, defect: str, has: bool = True, start: int = 0) -> int:
    """The first seed from ``start`` whose target system has (or lacks) ``defect``."""
    j = DEFECTS.index(defect)
    return next(s for s in range(start, start + 1000) if bool(SimWorld(benchmark, s).profile.present[j]) == has)


def request(world: SimWorld, checkpoint: str = "base", files: dict[str, str] | None = None, **kw) -> EvalRequest:
    return EvalRequest(checkpoint=checkpoint, harness_version="v", harness_files=files or world.initial_harness(), **kw)


def gain(world: SimWorld, checkpoint: str, files: dict[str, str], split: str = "official") -> float:
    """Expected score of ``checkpoint`` minus that of the base model, with the same harness."""
    return world.expected_score(checkpoint, files, split) - world.expected_score("base", files, split)


def train_on(world: SimWorld, teacher: str, n: int, *, filtered: bool, source: str = "synthetic", **train_args) -> str:
    """Generate (and maybe filter) data, start a training run; returns the checkpoint id."""
    tag = f"{len(world.datasets)}"
    world.rollout.generate(GenerateData(teacher=teacher, n_examples=n, source=source), f"gen-{tag}")
    data = f"gen-{tag}"
    if filtered:
        world.rollout.transform(TransformData(operation="filter", datasets=[data]), f"flt-{tag}")
        data = f"flt-{tag}"
    checkpoint = f"ckpt-{tag}"
    world.train.start(Train(dataset=data, **train_args), f"job-{tag}", checkpoint)
    return checkpoint


def scripted_run(seed: int) -> list:
    """A fixed sequence of calls; returns every result."""
    world = SimWorld("swe-bench-verified", seed)
    out = [world.rollout.generate(GenerateData(teacher="claude-opus-5", n_examples=300), "ds-1")]
    out.append(world.rollout.transform(TransformData(operation="filter", datasets=["ds-1"]), "ds-2"))
    job = world.train.start(Train(dataset="ds-2"), "job-1", "ckpt-1")
    out.append(job.future.result())
    world.clock.wait([job], deadline=1e9)
    out.append(world.evaluation.start(request(world, "ckpt-1", harness(world, *DEFECTS), k=2), "job-2").future.result())
    out.append(world.inference.complete(Infer(model="ckpt-1", prompt="task:dev/4")))
    out.append(world.evaluation.official(request(world, "ckpt-1", split="official")))
    return [r.model_dump() for r in out]


def test_world_satisfies_the_service_protocols():
    world = SimWorld("aime", 0)
    assert isinstance(world, World)
    assert isinstance(world.clock, SimClock)
    for service, protocol in [
        (world.rollout, RolloutService),
        (world.train, TrainService),
        (world.inference, InferenceService),
        (world.sandbox, SandboxService),
        (world.evaluation, EvalService),
    ]:
        assert isinstance(service, protocol)
    assert "prompt.md" in world.initial_harness() and "not modelled" in world.describe()
    world.close()
    world.close()


def test_construction_is_not_pathologically_slow():
    """Speed is measured in bench/ (about 0.8 ms a world idle); this only catches a 50x regression, with
    room for a loaded CI machine (6.5 ms under a load of 10 broke the old 5 ms bound)."""
    start = time.perf_counter()
    for seed in range(20):
        SimWorld("swe-bench-verified", seed)
    assert (time.perf_counter() - start) / 20 < 0.05


def test_same_seed_same_results_and_different_seeds_differ():
    assert scripted_run(3) == scripted_run(3)
    assert scripted_run(3) != scripted_run(4)


def test_unknown_benchmark_or_option_is_refused():
    with pytest.raises(ValueError, match="unknown benchmark"):
        SimWorld("mmlu", 0)
    with pytest.raises(ValueError, match="unknown sim options"):
        SimWorld("aime", 0, options={"warp": 2})


def test_sim_options_are_typed_with_the_calibrated_defaults():
    world = SimWorld("aime", 0)
    assert world.options == SimOptions() and world.options.model_dump() == {
        "eval_concurrency": 16, "generate_concurrency": 64, "transform_concurrency": 16,
        "train_tokens_per_second": 8000.0, "train_overhead_s": 120.0}
    assert SimWorld("aime", 0, options=SimOptions(eval_concurrency=4)).options.eval_concurrency == 4
    with pytest.raises(ValueError, match="eval_concurrency"):
        SimWorld("aime", 0, options={"eval_concurrency": 0})


@pytest.mark.parametrize("benchmark", list(BENCHMARKS))
def test_expected_initial_official_score_is_the_papers(benchmark):
    for seed in range(8):
        world = SimWorld(benchmark, seed)
        expected = world.expected_score("base", world.initial_harness(), "official")
        assert expected == pytest.approx(BENCHMARKS[benchmark].initial_score, abs=1e-6)


@pytest.mark.parametrize("benchmark", list(BENCHMARKS))
def test_sampled_initial_official_avg3_matches_the_paper_on_average(benchmark):
    scores = []
    for seed in range(200):
        world = SimWorld(benchmark, seed)
        scores.append(world.evaluation.official(request(world, split="official")).value.score)
    mean, error = np.mean(scores), np.std(scores) / np.sqrt(len(scores))
    assert abs(mean - BENCHMARKS[benchmark].initial_score) < 4 * error + 1e-9


def test_official_evaluation_of_the_unchanged_initial_system_reproduces_itself():
    world = SimWorld("terminal-bench-2", 11)
    first = world.evaluation.official(request(world, split="official")).value
    world.evaluation.start(request(world), "job-1")  # dev draws must not disturb the official ones
    renamed = EvalRequest(checkpoint="base", harness_version="other", harness_files=world.initial_harness())
    again = world.evaluation.official(renamed).value
    assert again.score == first.score and again.tasks == first.tasks


def test_official_outcomes_are_monotone_in_the_harness():
    """Fixing the system's defects raises the official score, an unneeded remedy on top lowers it: the
    official draw is fixed per world (sim result version 6 draws the score per world, so the common
    random numbers are the world's; per attempt they were up to version 5), on every seed tried."""
    for seed in range(12):
        world = SimWorld("swe-bench-verified", seed)
        if not present(world) or len(present(world)) == len(DEFECTS):
            continue
        before = world.evaluation.official(request(world, split="official")).value
        after = world.evaluation.official(request(world, files=fixed(world), split="official")).value
        worse = world.evaluation.official(request(world, files=harness(world, *DEFECTS), split="official")).value
        assert after.score > before.score and worse.score < after.score, seed


@pytest.mark.parametrize("benchmark", list(BENCHMARKS))
def test_each_fix_helps_where_the_system_has_the_defect_and_costs_where_not(benchmark):
    """Which defects a system has varies by seed: a fix helps on the seeds that have its defect and
    loses on the seeds that don't (where the domain can have it at all); elsewhere it changes nothing."""
    helps: dict[str, list[float]] = {d: [] for d in DEFECTS}
    costs: dict[str, list[float]] = {d: [] for d in DEFECTS}
    for seed in range(16):
        world = SimWorld(benchmark, seed)
        base = world.expected_score("base", world.initial_harness(), "dev")
        for defect, has in zip(DEFECTS, world.profile.present):
            change = world.expected_score("base", harness(world, defect), "dev") - base
            (helps if has else costs)[defect].append(change)
    for defect in DEFECTS:
        if defect in RELEVANT[benchmark]:
            assert helps[defect] and costs[defect], defect  # present on some seeds, absent on others
            assert min(helps[defect]) > 0 and max(costs[defect]) < 0, (defect, helps[defect], costs[defect])
        elif benchmark == "gpqa-diamond" and defect in ("truncated_output", "unverified_completion"):
            assert min(helps[defect], default=1) > 0 and max(costs[defect], default=-1) < 0
        else:
            assert helps[defect] == [] and max(map(abs, costs[defect])) == 0.0, defect


def test_a_blind_fix_of_everything_gains_nothing_on_average():
    """Issue 30: flipping every option without reading a log does not pay (expected official gain over
    40 seeds per benchmark), while fixing exactly the system's defects does, on every benchmark."""
    for benchmark in BENCHMARKS:
        blind, diagnosed = [], []
        for seed in range(40):
            world = SimWorld(benchmark, seed)
            base = world.expected_score("base", world.initial_harness(), "official")
            blind.append(world.expected_score("base", harness(world, *DEFECTS), "official") - base)
            diagnosed.append(world.expected_score("base", fixed(world), "official") - base)
        assert np.mean(blind) < 0.015, (benchmark, np.mean(blind))
        assert np.mean(diagnosed) > np.mean(blind) + 0.005 and min(diagnosed) >= 0.0, benchmark


def test_a_larger_output_cap_reduces_truncation_but_costs_tokens():
    world = SimWorld("aime", seed_where("aime", "truncated_output"))
    bigger = {**world.initial_harness()}
    bigger["harness.toml"] = bigger["harness.toml"].replace("max_output_tokens = 4096", "max_output_tokens = 16384")
    minimal = world.expected_score("base", world.initial_harness(), "dev")
    assert world.expected_score("base", bigger, "dev") > minimal + 0.05
    assert world.evaluation.quote(request(world, files=bigger)).usd > world.evaluation.quote(request(world)).usd


@pytest.mark.parametrize(
    "text, message",
    [
        ("[generation\nmax_output_tokens = 4096", "not valid TOML"),
        ("[shell]\npersistent = true\nsticky = true", "unknown key [shell] sticky"),
        ("[agent]\nsteps = 3", "unknown section [agent]"),
        ('[shell]\npersistent = "yes"', "must be true or false"),
        ("[generation]\nmax_output_tokens = true", "must be an integer"),
        ('[generation]\non_truncation = "retry"', '"stop" or "continue"'),
    ],
)
def test_a_broken_harness_fails_every_attempt_visibly(text, message):
    world = SimWorld("swe-bench-verified", 0)
    files = {**world.initial_harness(), "harness.toml": text}
    result = world.evaluation.start(request(world, files=files, n_tasks=5), "job-1").future.result().value
    assert result.score == 0.0 and result.failure_modes == {"harness_error": 15}
    assert all(f.startswith("harness_error: ") and message in f for t in result.tasks for f in t.failures)
    assert world.expected_score("base", files, "dev") == 0.0


def test_fixes_are_read_from_values_not_text():
    world = SimWorld("skillsbench", 1)
    commented = {**world.initial_harness()}
    commented["harness.toml"] += "# persistent = true\n"
    minimal = world.expected_score("base", world.initial_harness(), "dev")
    assert world.expected_score("base", commented, "dev") == minimal
    rewritten = {"harness.toml": "[shell]\npersistent=true\n"}
    fixed = world.expected_score("base", harness(world, "lost_shell_state"), "dev")
    assert world.expected_score("base", rewritten, "dev") == fixed


def test_evaluation_results_label_every_failure():
    world = SimWorld("skillsbench", 3)
    result = world.evaluation.start(request(world, k=4), "job-1").future.result().value
    assert len(result.tasks) == 37 and all(len(t.rewards) == 4 for t in result.tasks)
    labels = [f for t in result.tasks for r, f in zip(t.rewards, t.failures) if r == 0.0]
    assert labels and set(labels) <= set(FAILURE_MODES)
    assert sum(result.failure_modes.values()) == len(labels)
    # the symptoms are the system's own defects: every one of them shows, no other defect does
    assert set(result.failure_modes) - {"wrong_answer"} == set(present(world)) != set()
    assert world.evaluation.start(request(world, n_tasks=7), "job-2").future.result().value.tasks[-1].task == "dev/6"


@pytest.mark.parametrize("benchmark", list(BENCHMARKS))
def test_filtered_strong_teacher_data_with_default_training_usually_helps(benchmark):
    """Training helps on most systems but not on all: how well the data transfer varies by seed, and a
    researcher has to measure the checkpoint before submitting it."""
    gains, transfer = [], []
    for seed in range(30):
        world = SimWorld(benchmark, seed)
        checkpoint = train_on(world, "claude-opus-5", 1000, filtered=True)
        gains.append(gain(world, checkpoint, fixed(world)))
        transfer.append(world.profile.transfer)
    gains, transfer = np.array(gains), np.array(transfer)
    assert np.mean(gains) > 0 and 0.5 <= np.mean(gains > 0) <= 0.95, gains
    assert np.mean(gains[transfer > 0.5]) > 0 > np.mean(gains[transfer < 0]), gains


def test_unfiltered_weak_teacher_data_can_hurt_a_decent_model():
    drops = []
    for seed in range(30):
        world = SimWorld("gpqa-diamond", seed)
        checkpoint = train_on(world, "deepseek-v4.1-flash", 2000, filtered=False)
        drops.append(gain(world, checkpoint, fixed(world)))
    assert np.mean(drops) < 0 and np.mean(np.array(drops) < 0) > 0.7


def test_stronger_updates_usually_hurt_but_not_always():
    """The paper: the stronger of two same-data updates was worse in 8 of 10 comparisons."""
    worse = []
    benchmarks = list(BENCHMARKS)
    for seed in range(120):
        world = SimWorld(benchmarks[seed % len(benchmarks)], seed)
        default = train_on(world, "claude-opus-5", (300, 1000, 2000)[seed % 3], filtered=True)
        data = next(d for d in world.datasets if d.startswith("flt-"))
        world.train.start(Train(dataset=data, learning_rate=9e-4), "job-lr", "lr3")
        world.train.start(Train(dataset=data, num_epochs=3), "job-ep", "ep3")
        world.clock.spend(1e9)  # the default run has finished
        world.train.start(Train(dataset=data, base=default), "job-more", "more")
        files = fixed(world)
        reference = world.expected_score(default, files, "official")
        worse += [world.expected_score(c, files, "official") < reference for c in ("lr3", "ep3", "more")]
    assert 0.6 <= np.mean(worse) <= 0.95


def test_dev_sourced_data_raises_dev_more_than_official():
    for seed in range(5):
        world = SimWorld("swe-bench-verified", seed)
        checkpoint = train_on(world, "claude-opus-5", 1000, filtered=True, source="dev")
        files = fixed(world)
        assert gain(world, checkpoint, files, "dev") > gain(world, checkpoint, files, "official") + 0.05


def test_transforms_change_the_measured_stats():
    world = SimWorld("terminal-bench-2", 0)
    raw = world.rollout.generate(GenerateData(teacher="deepseek-v4.1-flash", n_examples=2000), "ds-1").value
    filtered = world.rollout.transform(TransformData(operation="filter", datasets=["ds-1"]), "ds-2").value
    deduped = world.rollout.transform(TransformData(operation="dedupe", datasets=["ds-1"]), "ds-3").value
    mixed = world.rollout.transform(TransformData(operation="mix", datasets=["ds-1", "ds-2"]), "ds-4").value
    call = GenerateData(teacher="deepseek-v4.1-flash", n_examples=2000)
    d = world.domain
    _, cut = truncated_mean_tokens(d.example_completion_median, d.example_completion_sigma, call.max_tokens_per_example)
    expected = world.teacher_accuracy(call.teacher) * (1.0 - cut)  # this seed's teacher on this seed's tasks
    assert abs(raw.stats["pass_rate"] - expected) < 3 * (expected * (1 - expected) / 2000) ** 0.5 + 1e-3
    assert 0.15 < raw.stats["duplicate_fraction"] < 0.35
    assert filtered.stats["pass_rate"] > 0.95 and filtered.n_examples < 0.45 * raw.n_examples
    assert deduped.stats["duplicate_fraction"] < 0.05 and deduped.n_examples < raw.n_examples
    assert mixed.n_examples == raw.n_examples + filtered.n_examples and mixed.tokens == raw.tokens + filtered.tokens
    assert raw.stats["dev_fraction"] == 0.0 and len(raw.preview) == 2 and "[sim]" in str(raw.preview)
    dev = world.rollout.generate(GenerateData(teacher="claude-opus-5", n_examples=50, source="dev"), "ds-5").value
    assert dev.stats["dev_fraction"] == 1.0


def opus(n: int, cap: int) -> GenerateData:
    return GenerateData(teacher="claude-opus-5", n_examples=n, max_tokens_per_example=cap)


def test_a_low_completion_cap_truncates_examples():
    world = SimWorld("aime", 0)
    capped = world.rollout.generate(opus(2000, 2048), "a")
    roomy = world.rollout.generate(opus(2000, 16384), "b")
    assert capped.value.stats["pass_rate"] < roomy.value.stats["pass_rate"] - 0.3
    assert capped.cost_usd < roomy.cost_usd


def test_cost_targets():
    # the paper's system: long replies (truncation is one of its defects)
    swe = SimWorld("swe-bench-verified", seed_where("swe-bench-verified", "truncated_output"))
    aime = SimWorld("aime", seed_where("aime", "truncated_output"))
    assert 25 <= swe.evaluation.quote(request(swe)).usd <= 35
    assert 2 <= aime.evaluation.quote(request(aime)).usd <= 4
    generated = swe.rollout.generate(GenerateData(teacher="claude-opus-5", n_examples=1000), "ds-1")
    assert 135 <= generated.cost_usd <= 165
    assert 10 <= swe.train.quote(Train(dataset="ds-1")).usd <= 15
    cheap = swe.rollout.generate(GenerateData(teacher="deepseek-v4.1-flash", n_examples=1000), "ds-2")
    assert 15 <= generated.cost_usd / cheap.cost_usd <= 25


def test_training_result_and_timing():
    world = SimWorld("gpqa-diamond", 0)
    world.rollout.generate(GenerateData(teacher="claude-opus-5", n_examples=5000), "ds-1")
    job = world.train.start(Train(dataset="ds-1", num_epochs=2, batch_size=8), "job-1", "ckpt-1")
    result = job.future.result().value
    assert result.steps == 1250 and result.tokens == 2 * world.datasets["ds-1"].tokens
    assert len(result.loss_curve) <= 200 and result.loss_curve[-1] < result.loss_curve[0]
    assert result.config["num_epochs"] == 2 and job.ready_at > 0
    with pytest.raises(ActionError, match="still training"):
        world.evaluation.quote(request(world, "ckpt-1"))
    assert world.clock.wait([job], deadline=1e9) is job and world.clock.now() == job.ready_at
    world.evaluation.quote(request(world, "ckpt-1"))


def test_infer_samples_dev_tasks_and_is_honest_otherwise():
    world = SimWorld("aime", 0)
    task = world.inference.complete(Infer(prompt="task:dev/0", max_tokens=32768)).value
    assert task.text.startswith("[sim] dev/0: ") and task.finish_reason == "stop"
    cut = world.inference.complete(Infer(prompt="task:dev/0", max_tokens=16)).value
    assert cut.finish_reason == "length" and "truncated_output" in cut.text and cut.completion_tokens == 16
    chat = world.inference.complete(Infer(prompt="What is 2+2?")).value
    assert "models task outcomes, not text" in chat.text and "task:dev/" in chat.text


def test_sandbox_models_a_few_commands():
    world = SimWorld("aime", 0)
    world.rollout.generate(GenerateData(teacher="claude-opus-5", n_examples=30), "ds-1")

    def run(command: str, timeout: int = 60):
        return world.sandbox.exec(SandboxExec(command=command, timeout_s=timeout)).value

    assert run("ls /data").stdout == "ds-1.jsonl\n"
    assert run("wc -l /data/ds-1.jsonl").stdout == "30 /data/ds-1.jsonl\n"
    assert len(run("head -n 3 /data/ds-1.jsonl").stdout.splitlines()) == 3
    assert run("echo 'hi there'").stdout == "hi there\n" and run("true").exit_code == 0
    assert run("sleep 5").duration_s == 5 and run("sleep 90", timeout=30).exit_code == 124
    assert run("wc -l /data/nope.jsonl").exit_code == 1
    missing = run("python train.py")
    assert missing.exit_code == 127 and "runs no code" in missing.stderr
    for _ in range(2):  # the second time from the cache of parsed commands
        broken = run("echo 'unclosed")
        assert broken.exit_code == 2 and broken.stderr == "sim sandbox: cannot parse command: No closing quotation\n"
    world.rollout.generate(GenerateData(teacher="claude-opus-5", n_examples=5), "ds-2")
    assert run("ls /data").stdout == "ds-1.jsonl\nds-2.jsonl\n"  # parsed once, run against today's data


def test_billed_cost_never_exceeds_the_quote():
    world = SimWorld("swe-bench-verified", 7)
    pairs = []
    for teacher in ("claude-opus-5", "gpt-6-astra", "deepseek-v4.1-flash"):
        for cap in (256, 2048, 8192, 32768):
            call = GenerateData(teacher=teacher, n_examples=200, max_tokens_per_example=cap)
            pairs.append((world.rollout.quote_generate(call), world.rollout.generate(call, f"{teacher}-{cap}")))
    for operation in ("filter", "dedupe", "mix"):
        call = TransformData(operation=operation, datasets=["claude-opus-5-8192", "gpt-6-astra-2048"])
        pairs.append((world.rollout.quote_transform(call), world.rollout.transform(call, operation)))
    for call in (Train(dataset="filter"), Train(dataset="mix", num_epochs=3, learning_rate=1e-3)):
        pairs.append((world.train.quote(call), world.train.start(call, "job", "ckpt").future.result()))
    for call in (Infer(prompt="task:dev/2"), Infer(prompt="task:dev/2", max_tokens=10), Infer(prompt="hello " * 500)):
        pairs.append((world.inference.quote(call), world.inference.complete(call)))
    for command in ("ls /data", "sleep 30", "sleep 999", "head /data/mix.jsonl", "make"):
        call = SandboxExec(command=command, timeout_s=100)
        pairs.append((world.sandbox.quote(call), world.sandbox.exec(call)))
    broken = {"harness.toml": "[nope]"}
    fixed = harness(world, *DEFECTS)
    for req in (request(world), request(world, files=fixed, k=8, n_tasks=10), request(world, files=broken)):
        pairs.append((world.evaluation.quote(req), world.evaluation.start(req, "job").future.result()))
    official = request(world, files=harness(world, *DEFECTS), split="official")
    pairs.append((world.evaluation.quote(official), world.evaluation.official(official)))
    for quote, billed in pairs:
        assert billed.cost_usd <= quote.usd + 1e-12
        assert billed.cost_usd > 0


@settings(max_examples=60, deadline=None)
@given(
    benchmark=st.sampled_from(list(BENCHMARKS)),
    teacher=st.sampled_from(["claude-opus-5", "gpt-6-astra", "deepseek-v4.1-flash"]),
    n=st.integers(1, 3000),
    cap=st.integers(256, 32768),
    source=st.sampled_from(["synthetic", "dev"]),
    train=st.fixed_dictionaries(
        {
            "learning_rate": st.floats(1e-6, 1e-2),
            "num_epochs": st.integers(1, 10),
            "lora_rank": st.integers(1, 256),
            "batch_size": st.integers(1, 512),
            "lr_schedule": st.sampled_from(["constant", "linear", "cosine"]),
        }
    ),
    prompt=st.text(max_size=60),
    max_tokens=st.integers(1, 32768),
    command=st.text(max_size=40),
    k=st.integers(1, 8),
)
def test_billed_never_exceeds_the_quote_for_any_arguments(
    benchmark, teacher, n, cap, source, train, prompt, max_tokens, command, k
):
    world = SimWorld(benchmark, n)
    generate = GenerateData(teacher=teacher, n_examples=n, source=source, max_tokens_per_example=cap)
    pairs = [(world.rollout.quote_generate(generate), world.rollout.generate(generate, "ds-1"))]
    call = Train(dataset="ds-1", **train)
    job = world.train.start(call, "job-1", "ckpt-1")
    pairs.append((world.train.quote(call), job.future.result()))
    assert np.isfinite(world.model_state("ckpt-1", require_ready=False).skill)
    world.clock.wait([job], deadline=float("inf"))
    for text in (prompt, "task:dev/0"):
        infer = Infer(model="ckpt-1", prompt=text, max_tokens=max_tokens)
        pairs.append((world.inference.quote(infer), world.inference.complete(infer)))
    sandbox = SandboxExec(command=command, timeout_s=30)
    pairs.append((world.sandbox.quote(sandbox), world.sandbox.exec(sandbox)))
    evaluate = request(world, "ckpt-1", harness(world, *DEFECTS[:k % 5]), k=k, n_tasks=k)
    pairs.append((world.evaluation.quote(evaluate), world.evaluation.start(evaluate, "job-2").future.result()))
    for quote, billed in pairs:
        assert 0 <= billed.cost_usd <= quote.usd + 1e-12


@pytest.mark.parametrize(
    "call",
    [
        lambda w: w.rollout.quote_generate(GenerateData(teacher="gpt-2", n_examples=10)),
        lambda w: w.rollout.quote_transform(TransformData(operation="filter", datasets=["ds-9"])),
        lambda w: w.train.quote(Train(dataset="ds-9")),
        lambda w: w.train.quote(Train(dataset="ds-1", base="ckpt-9")),
        lambda w: w.inference.quote(Infer(model="ckpt-9", prompt="hi")),
        lambda w: w.inference.quote(Infer(prompt="task:dev/100")),
        lambda w: w.evaluation.quote(request(w, "ckpt-9")),
    ],
)
def test_unknown_references_are_refused_by_the_quote(call):
    world = SimWorld("gpqa-diamond", 0)
    world.rollout.generate(GenerateData(teacher="claude-opus-5", n_examples=10), "ds-1")
    with pytest.raises(ActionError) as err:
        call(world)
    assert err.value.code == "unknown_ref"


def test_what_the_sim_cannot_do_is_refused_by_the_quote():
    world = SimWorld("gpqa-diamond", 0)
    world.rollout.generate(GenerateData(teacher="claude-opus-5", n_examples=10), "ds-1")
    with pytest.raises(ActionError, match="use world='local'") as err:
        world.rollout.quote_transform(TransformData(operation="script", datasets=["ds-1"], script="cat"))
    assert err.value.code == "not_supported"
    with pytest.raises(ActionError) as err:
        world.evaluation.start(request(world, split="official"), "job-1")
    assert err.value.code == "not_supported"


def test_clock_waits_for_the_earliest_job():
    world = SimWorld("aime", 0)
    world.rollout.generate(GenerateData(teacher="claude-opus-5", n_examples=100), "ds-1")
    slow = world.train.start(Train(dataset="ds-1", num_epochs=5), "job-1", "ckpt-1")
    fast = world.evaluation.start(request(world, n_tasks=3, k=1), "job-2")
    assert fast.ready_at < slow.ready_at
    assert world.clock.wait([slow, fast], deadline=fast.ready_at - 1) is None
    assert world.clock.now() == fast.ready_at - 1
    assert world.clock.wait([slow, fast], deadline=1e9) is fast
    assert not slow.is_done(world.clock.now()) and fast.is_done(world.clock.now())
    world.clock.spend(10.0)
    assert world.clock.now() == fast.ready_at + 10
