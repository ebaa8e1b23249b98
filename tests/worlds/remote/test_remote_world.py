"""The remote world offline: credentials, dry run, prices, typed errors, and its services driven by stand-ins
(the local Tinker-shaped client for Tinker, a fake ``chat.completions`` for the endpoints, a fake E2B)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from rsigym_env.cli import main
from rsigym_env.errors import ActionError
from rsigym_env.scenario import load_scenario
from rsigym_env.tools import Infer, SandboxExec, Train
from rsigym_env.worlds.remote import pricing
from rsigym_env.worlds.remote.errors import MissingCredentials, call_with_retries, translate

ENV = {"TINKER_API_KEY": "tml-test", "RSIGYM_TEACHER_API_KEY": "k", "RSIGYM_TEACHER_BASE_URL": "http://teachers.invalid/v1",
       "E2B_API_KEY": "e2b_test"}


class FakeCompletions:
    """An OpenAI ``chat.completions`` stand-in that records the provider model names it is asked for."""

    def __init__(self, fail: list[Exception] | None = None):
        self.models: list[str] = []
        self.fail = list(fail or [])

    def create(self, *, model: str, messages, max_tokens=16, **kw):
        if self.fail:
            raise self.fail.pop(0)
        self.models.append(model)
        usage = SimpleNamespace(prompt_tokens=11, completion_tokens=3,
                                prompt_tokens_details=SimpleNamespace(cached_tokens=5))
        message = SimpleNamespace(content=f"reply from {model}", tool_calls=None)
        return SimpleNamespace(choices=[SimpleNamespace(message=message, finish_reason="stop")], usage=usage)


@pytest.fixture()
def tasks(tmp_path):
    out = {}
    for split in ("dev", "official"):
        d = tmp_path / "tasks" / split / f"{split}-task"
        d.mkdir(parents=True)
        (d / "task.toml").write_text("")
        out[split] = d.parent
    return out


@pytest.fixture()
def local_tinker(tmp_path):
    """Tinker's interface offline: the local client, a tiny random base registered as the scenario's base model."""
    from rsigym_env.worlds.local.lm import tinker_client
    from rsigym_env.worlds.local.lm.model import ModelConfig

    tinker_client.register_base_model("Qwen/Qwen3.5-35B-A3B-Base", tinker_client.make_random_base(
        tmp_path / "base", ModelConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, max_seq_len=256)))
    return tinker_client.LocalServiceClient(root_dir=tmp_path / "tinker")


def remote_world(tmp_path, tasks, **kw):
    from rsigym_env.worlds.remote.world import RemoteWorld

    scenario = load_scenario("remote-joint-aime", world_options={"renderer": "role_colon"})
    kw.setdefault("environ", ENV)
    return RemoteWorld(scenario, 0, tmp_path / "run", tasks=tasks, **kw)


def test_missing_credentials_are_named_before_anything_is_made(tmp_path, tasks):
    from rsigym_env.worlds.remote.world import RemoteWorld

    with pytest.raises(MissingCredentials) as err:
        RemoteWorld(load_scenario("remote-joint-aime"), 0, tmp_path / "run", tasks=tasks, environ={})
    assert err.value.code == "missing_credentials"
    assert {"TINKER_API_KEY", "E2B_API_KEY", "RSIGYM_TEACHER_API_KEY"} <= set(err.value.variables)
    assert not (tmp_path / "run").exists()  # nothing was created


def test_dry_run_says_what_is_missing_and_fails(monkeypatch, capsys):
    for var in ENV:
        monkeypatch.delenv(var, raising=False)
    code = main(["run", "--scenario", "remote-joint-gpqa-diamond", "--dry-run"])
    out = capsys.readouterr().out
    assert code == 1
    assert "TINKER_API_KEY" in out and "missing" in out and "gpqa-diamond@1.0" in out
    assert "prefill 0.54" in out


def test_dry_run_reads_the_dataset_variable_and_refuses_tasks_without_network(tmp_path, monkeypatch):
    from rsigym_env.worlds.remote.dryrun import run_checks

    scenario = load_scenario("remote-counterparts-aime")
    by_name = lambda checks: {c.name: c for c in checks}  # noqa: E731
    assert by_name(run_checks(scenario, environ={}, network=False))["tasks"].status == "missing"
    for name, mode in (("a-task", "public"), ("b-task", "no-network")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "task.toml").write_text(f'[environment]\nnetwork_mode = "{mode}"\n')
    checks = by_name(run_checks(scenario, environ={"RSIGYM_REMOTE_TASKS": str(tmp_path)}, network=False))
    assert checks["tasks"].status == "ok"  # the bubblewrap environment opens the network for public tasks only:
    assert checks["task network"].status == "fail" and "b-task" in checks["task network"].detail
    docker = load_scenario("remote-counterparts-aime", world_options={"evaluation": {"environment": "docker"}})
    checks = by_name(run_checks(docker, environ={"RSIGYM_REMOTE_TASKS": str(tmp_path)}, network=False))
    assert checks["task network"].status == "ok" and "allowlist" in checks["task network"].detail
    (tmp_path / "b-task" / "task.toml").write_text('[environment]\nnetwork_mode = "public"\n')
    checks = by_name(run_checks(scenario, environ={"RSIGYM_REMOTE_TASKS": str(tmp_path)}, network=False))
    assert checks["task network"].status == "ok"


def test_dry_run_of_a_sim_scenario_passes(capsys):
    assert main(["run", "--scenario", "sim-joint-aime-500", "--dry-run"]) == 0


def test_bundled_price_list_is_tinkers_format_with_its_date():
    rows = json.loads(pricing.BUNDLED.read_text())
    assert all({"tinker_id", "prefill", "sample", "train", "context"} <= set(r) for r in rows)
    assert json.loads(pricing.BUNDLED_META.read_text())["source_url"] == pricing.TINKER_MODELS_URL
    p = pricing.model_price("Qwen/Qwen3.5-9B-Base")
    assert (p.prefill, p.sample, p.train) == (0.66, 1.995, 1.463) and p.cached == pytest.approx(0.132)
    with pytest.raises(KeyError, match="not in Tinker's price list"):
        pricing.model_price("no/such-model")


def test_refresh_validates_and_writes_a_dated_copy(tmp_path, monkeypatch):
    import io

    good = [{"tinker_id": "m", "prefill": "$1", "sample": "$2", "train": "$3", "context": "1K"}]
    monkeypatch.setattr(pricing.urllib.request, "urlopen", lambda req, timeout: io.BytesIO(json.dumps(good).encode()))
    path = pricing.refresh(dest=tmp_path / "tinker_models.json")
    assert pricing.load_tinker_models(path) == good
    assert "retrieved" in json.loads((tmp_path / "tinker_models.meta.json").read_text())
    monkeypatch.setattr(pricing.urllib.request, "urlopen", lambda req, timeout: io.BytesIO(b'[{"tinker_id": "m"}]'))
    with pytest.raises(ValueError):
        pricing.refresh(dest=tmp_path / "other.json")
    assert not (tmp_path / "other.json").exists()


@pytest.mark.parametrize("exc, code", [
    (TimeoutError("slow"), "service_timeout"), (ConnectionRefusedError("no"), "service_unreachable"),
    (SimpleNamespace and type("RateLimitError", (Exception,), {"status_code": 429})("429"), "rate_limited"),
    (type("BadRequestError", (Exception,), {"status_code": 400})("bad"), "provider_error"),
])
def test_provider_errors_become_typed_codes(exc, code):
    assert translate(exc).code == code


def test_client_errors_are_not_retried_but_server_errors_are():
    bad = type("BadRequestError", (Exception,), {"status_code": 400})
    calls = []

    def fail_bad():
        calls.append(1)
        raise bad("no")

    with pytest.raises(ActionError):
        call_with_retries(fail_bad, what="x", backoff_s=0)
    assert len(calls) == 1


def _sdk_errors():
    import e2b.exceptions as e2b
    import httpx
    import openai
    import tinker

    req = httpx.Request("POST", "http://provider.invalid/v1/chat/completions")
    return [
        (openai.APITimeoutError(request=req), "service_timeout", True),
        (openai.APIConnectionError(request=req), "service_unreachable", True),
        (openai.RateLimitError("slow down", response=httpx.Response(429, request=req), body=None), "rate_limited", True),
        (openai.InternalServerError("oops", response=httpx.Response(500, request=req), body=None), "provider_error", True),
        (openai.BadRequestError("no", response=httpx.Response(400, request=req), body=None), "provider_error", False),
        (tinker.APIConnectionError(request=req), "service_unreachable", True),
        (httpx.ReadTimeout("slow", request=req), "service_timeout", True),
        (httpx.ConnectError("refused", request=req), "service_unreachable", True),
        (e2b.SandboxUnreachableException("gone"), "service_unreachable", True),
        (e2b.TimeoutException("slow"), "service_timeout", True),
        (e2b.RateLimitException("slow down"), "rate_limited", True),
        (e2b.ServiceBusyException("busy"), "provider_error", True),
        (e2b.SandboxNotRunningException("stopped"), "provider_error", False),
    ]


def test_the_sdks_typed_errors_decide_code_and_retry():
    for exc, code, retried in _sdk_errors():
        calls = []

        def fail(exc=exc):
            calls.append(1)  # noqa: B023 (called within this iteration)
            raise exc

        with pytest.raises(ActionError) as err:
            call_with_retries(fail, what="x", attempts=3, backoff_s=0)
        assert (err.value.code, len(calls)) == (code, 3 if retried else 1), type(exc).__name__
        assert translate(exc).code == code


def test_retries_back_off_exponentially_and_stop_once_it_works():
    waits, calls = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("refused")
        return "ok"

    assert call_with_retries(flaky, what="x", attempts=4, backoff_s=0.5, sleep=waits.append) == "ok"
    assert waits == [0.5, 1.0] and len(calls) == 3


def test_inference_routes_checkpoints_to_tinker_paths_and_bills_cached_tokens(tmp_path, tasks, local_tinker):
    inference = FakeCompletions()
    world = remote_world(tmp_path, tasks, service_client=local_tinker, inference=inference, teachers={},
                         sandbox_create=lambda **kw: None)
    try:
        call = Infer(model="base", prompt="hi", max_tokens=8)
        billed = world.inference.complete(call)
        assert inference.models == ["Qwen/Qwen3.5-35B-A3B-Base"]
        assert billed.cost_usd == pytest.approx(world.prices.sample_usd_cached(11, 5, 3))
        assert billed.cost_usd <= world.inference.quote(call).usd
        with pytest.raises(ActionError) as err:
            world.inference.quote(Infer(model="ckpt-1", prompt="hi"))
        assert err.value.code == "unknown_ref"
    finally:
        world.close()


def test_provider_failure_in_inference_is_typed(tmp_path, tasks, local_tinker):
    limited = type("RateLimitError", (Exception,), {"status_code": 429})
    world = remote_world(tmp_path, tasks, service_client=local_tinker, teachers={}, sandbox_create=lambda **kw: None,
                         inference=FakeCompletions(fail=[limited("slow down")] * 3))
    world.client.backoff_s = 0.0
    try:
        with pytest.raises(ActionError) as err:
            world.inference.complete(Infer(model="base", prompt="hi", max_tokens=8))
        assert err.value.code == "rate_limited"
    finally:
        world.close()


def test_training_runs_the_local_loop_and_serves_the_checkpoint_by_its_path(tmp_path, tasks, local_tinker):
    inference = FakeCompletions()
    world = remote_world(tmp_path, tasks, service_client=local_tinker, inference=inference, teachers={},
                         sandbox_create=lambda **kw: None)
    try:
        rows = [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}] * 4
        world.save_dataset("ds-1", rows, "test")
        call = Train.model_validate({"dataset": "ds-1", "batch_size": 2, "learning_rate": 1e-3})
        assert world.train.rank(call) == call.lora_rank  # no scenario rank: the tool's default
        billed = world.train.start(call, "job-1", "ckpt-1").future.result(timeout=120)
        assert billed.value.steps == 2 and billed.cost_usd <= world.train.quote(call).usd
        assert world.checkpoints["ckpt-1"].startswith("tinker://")
        world.inference.complete(Infer(model="ckpt-1", prompt="hi", max_tokens=4))
        assert inference.models[-1] == world.checkpoints["ckpt-1"]
    finally:
        world.close()


def test_scenario_lora_rank_applies_when_the_call_names_none(tmp_path, tasks, local_tinker):
    from rsigym_env.worlds.remote.world import RemoteWorld

    scenario = load_scenario("remote-joint-aime", world_options={"lora_rank": 8})
    world = RemoteWorld(scenario, 0, tmp_path / "run", tasks=tasks, environ=ENV, service_client=local_tinker,
                        inference=FakeCompletions(), teachers={}, sandbox_create=lambda **kw: None)
    try:
        assert world.train.rank(Train.model_validate({"dataset": "d"})) == 8
        assert world.train.rank(Train.model_validate({"dataset": "d", "lora_rank": 4})) == 4
    finally:
        world.close()


class FakeE2B:
    """``Sandbox.create`` stand-in: counts live sandboxes, runs nothing real."""

    def __init__(self):
        self.alive = 0
        self.kwargs: list[dict] = []

    def __call__(self, **kw):
        self.alive += 1
        self.kwargs.append(kw)
        owner = self

        class Box:
            commands = SimpleNamespace(run=lambda cmd, **k: SimpleNamespace(stdout="ok\n", stderr="", exit_code=0))
            files = None

            def set_timeout(self, s):
                pass

            def kill(self):
                owner.alive -= 1

        return Box()


def test_sandbox_is_lazy_limited_and_bills_idle_time(tmp_path, tasks, local_tinker):
    e2b = FakeE2B()
    world = remote_world(tmp_path, tasks, service_client=local_tinker, inference=FakeCompletions(), teachers={},
                         sandbox_create=e2b)
    try:
        assert e2b.alive == 0  # nothing runs (or is billed) before the first command
        call = SandboxExec(command="echo ok", timeout_s=10)
        billed = world.sandbox.exec(call)
        assert billed.value.stdout == "ok\n" and e2b.alive == 1
        assert e2b.kwargs[0]["timeout"] == world.options.sandbox.lifetime_s and e2b.kwargs[0]["api_key"] == "e2b_test"
        assert 0 < billed.cost_usd <= world.sandbox.quote(call).usd
        for _ in range(world.sandbox.max_sandboxes - 1):
            world.sandbox.backend._new_sandbox()
        with pytest.raises(ActionError) as err:
            world.sandbox.backend._new_sandbox()
        assert err.value.code == "sandbox_limit"
    finally:
        world.close()


def test_dry_run_names_a_harbor_environment_whose_packages_are_missing(monkeypatch):
    import importlib.metadata

    from rsigym_env.worlds.remote.dryrun import harbor_extra_missing

    assert harbor_extra_missing("e2b") == []  # the services extra installs harbor[e2b] (dockerfile-parse)
    fake = ['surely-not-installed-pkg>=1.0; extra == "e2b"', 'e2b>=2.25.0; extra == "e2b"', 'rich; extra == "other"',
            "pydantic>=2"]
    monkeypatch.setattr(importlib.metadata, "requires", lambda name: fake if name == "harbor" else [])
    assert harbor_extra_missing("e2b") == ["surely-not-installed-pkg>=1.0"]
    assert harbor_extra_missing("docker") == []


def test_a_task_without_network_lets_only_the_model_proxy_through_in_the_agent_phase(tmp_path, tasks, local_tinker):
    """Harnesses reach the metering proxy over TCP: Harbor's own network planning gives a no-network task's agent
    phase an allowlist holding just the proxy's host; the verifier phase and public tasks are left as they are."""
    from harbor.models.task.config import NetworkMode, TaskConfig as HarborTask, VerifierEnvironmentMode
    from harbor.models.trial.config import EnvironmentConfig as TrialEnvironmentConfig
    from harbor.models.trial.config import VerifierConfig
    from harbor.trial.network_policy import resolve_trial_network_plan

    from rsigym_env.services import EvalRequest

    world = remote_world(tmp_path, tasks, service_client=local_tinker, inference=FakeCompletions(), teachers={},
                         sandbox_create=lambda **kw: None)
    try:
        req = EvalRequest(checkpoint="base", harness_version="h-0", harness_files=world.initial_harness(), k=1)
        offline = tmp_path / "offline-task"
        offline.mkdir()
        (offline / "task.toml").write_text('[environment]\nnetwork_mode = "no-network"\n')
        job = world.evaluation._job_config(req, [offline], tmp_path / "job", tmp_path / "h", "s")
        agent = job.agents[0]
        assert agent.extra_allowed_hosts == ["host.docker.internal"]  # docker's default model_url
        for mode, agent_phase in ((NetworkMode.NO_NETWORK, NetworkMode.ALLOWLIST), (NetworkMode.PUBLIC, NetworkMode.PUBLIC)):
            task = HarborTask.model_validate_toml(f'[environment]\nnetwork_mode = "{mode.value}"\n')
            plan = resolve_trial_network_plan(task, agent, TrialEnvironmentConfig(), VerifierConfig(), None,
                                              verifier_mode=VerifierEnvironmentMode.SHARED)
            assert plan.agent_phase.network_mode == agent_phase
            if agent_phase == NetworkMode.ALLOWLIST:
                assert plan.agent_phase.allowed_hosts == ["host.docker.internal"]
            assert plan.verifier_phase.network_mode == mode  # the tests still run as the task says
        public = tmp_path / "public-task"
        public.mkdir()
        (public / "task.toml").write_text('[environment]\nnetwork_mode = "public"\n')
        job = world.evaluation._job_config(req, [public], tmp_path / "job2", tmp_path / "h", "s")
        assert job.agents[0].extra_allowed_hosts == []  # nothing for Harbor to ignore (and log, once a trial)
        job = world.evaluation._job_config(req, [public, offline], tmp_path / "job3", tmp_path / "h", "s")
        assert job.agents[0].extra_allowed_hosts == ["host.docker.internal"]
    finally:
        world.close()


def test_the_world_reads_its_endpoints_from_the_environment_it_is_given(tmp_path, tasks, local_tinker, monkeypatch):
    """``environ`` replaces the process's environment for every endpoint, not only for the credentials."""
    for var in ("TINKER_BASE_URL", "E2B_API_URL", "E2B_SANDBOX_URL", "RSIGYM_TEACHER_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    environ = ENV | {"TINKER_BASE_URL": "http://tinker.invalid:1", "E2B_API_URL": "http://e2b.invalid:2",
                     "E2B_SANDBOX_URL": "http://sandboxes.invalid:3", "RSIGYM_TEACHER_BASE_URL": "http://t.invalid:4/v1"}
    world = remote_world(tmp_path, tasks, environ=environ, service_client=local_tinker, sandbox_create=lambda **kw: None)
    try:
        assert world.inference_url == "http://tinker.invalid:1/oai/api/v1"
        assert world.client.get("claude-opus-5") is not None  # the teacher's endpoint came from environ
        assert world.sandbox.backend._api == {"api_key": "e2b_test", "api_url": "http://e2b.invalid:2",
                                              "sandbox_url": "http://sandboxes.invalid:3"}
    finally:
        world.close()


def _dataset(root, n=20):
    for i in range(n):
        (root / f"task-{i:02d}").mkdir(parents=True)
        (root / f"task-{i:02d}" / "task.toml").write_text("")
    return root


def _official(world) -> set[str]:
    return {p.name for p in world.tasks["official"].iterdir()}


def test_each_episode_draws_its_own_official_tasks_from_the_secret(tmp_path, local_tinker, monkeypatch):
    """A remote episode's held-out tasks are its own draw (secret + nonce), not a split anyone can compute from the
    scenario: two episodes of the same scenario and seed split differently, a pinned draw repeats, and the result
    records which kind of split it was, never the secret or the nonce."""
    from rsigym_env.worlds.remote.world import RemoteWorld

    monkeypatch.delenv("RSIGYM_SPLIT_NONCE", raising=False)
    monkeypatch.setenv("RSIGYM_SPLIT_SECRET", "remote-split-test-secret")
    data = _dataset(tmp_path / "dataset")

    def world(run: str, **options):
        scenario = load_scenario("remote-joint-aime", world_options={
            "renderer": "role_colon", "evaluation": {"dataset_path": str(data), **options}})
        return RemoteWorld(scenario, 0, tmp_path / run, environ=ENV, service_client=local_tinker,
                           sandbox_create=lambda **kw: None)

    worlds = [world(f"run-{i}") for i in range(3)]
    try:
        draws = [_official(w) for w in worlds]
        assert all(len(d) == 10 for d in draws) and len({frozenset(d) for d in draws}) > 1
        info = worlds[0].official_split
        assert info["mode"] == "secret" and info["draw"] == "per-episode"
        assert "remote-split-test-secret" not in json.dumps(info) and worlds[0].split.nonce not in json.dumps(info)
        assert "drawn for this episode from a secret" in worlds[0].describe()
        monkeypatch.setenv("RSIGYM_SPLIT_NONCE", "pinned")
        pinned = [world(f"pinned-{i}") for i in range(2)]
        worlds += pinned
        assert _official(pinned[0]) == _official(pinned[1]) and pinned[0].official_split["draw"] == "fixed"
        public = [world(f"public-{i}", official_split="public", split_seed=7) for i in range(2)]
        worlds += public
        assert _official(public[0]) == _official(public[1]) and public[0].official_split["mode"] == "public"
        from rsigym_env.worlds.remote.evaluation import split_tasks

        assert _official(public[0]) == {p.name for p in split_tasks(sorted(data.iterdir()), 0.5, 7)["official"]}
    finally:
        for w in worlds:
            w.close()
