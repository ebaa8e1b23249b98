"""Any agent as the improver of a researcher program, through the session service's MCP endpoint.

A run of ``rsigym serve`` on a recursive scenario whose target is the seed program
(``rsigym_env/programs/seed/``): its harness files are the program's spec, so an MCP client reads
``code/researcher.py`` (``read harness:latest/code/researcher.py``, 8,000-character pages with
``@offset``), rewrites a value of its ``STRATEGY`` literal, uploads the file with ``edit_harness``,
measures the edited and the original program on dev (``evaluate`` + ``wait``) and ``submit``\\ s the
better one. Played over streamable HTTP with the real ``mcp`` SDK client on loopback, the programs run in
their sandbox (bubblewrap; skipped where it is not usable):

* by hand (the test is the agent), once with an edit that wins on dev and once with one that loses;
* by the ``llm`` researcher (``baselines/llm_researcher.py``) whose chat model is a scripted model served
  over real HTTP, each of its tool calls sent as an MCP tool call and each MCP result fed back as the
  tool message.

And over ``rsigym recurse``'s whole round loop (:class:`rsigym_env.gateway.recursion.AgentImprover`: each
round's outer episode a session with a key of its own): 2 rounds x 1 chain, the test as the agent over the MCP
SDK client, then the ``llm`` researcher with its scripted chat model; the archive grows, acceptance follows the
paired validation gains, every session's audit verifies; ``--improver-command`` from the command line.

All check that nothing the client received names a held-out seed: the recursive world's official
(validation) and test seeds are drawn from the platform's split secret (``held_out_seeds``), and neither
they nor the inner episodes' seeds made from them, nor an ``official|test/<benchmark>/seed-<n>`` id, may
appear; only ``dev/...`` task ids name seeds.
"""

from __future__ import annotations

import ast
import contextlib
import json
import math
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any, AsyncIterator

import anyio
import anyio.to_thread
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from gateway_helpers import serve_in_thread
from rsigym_env.agents import builtin_spec
from rsigym_env.gateway.mcp_server import OBSERVATION_URI, mcp_http_app
from rsigym_env.gateway.rest import create_app
from rsigym_env.gateway.service import SessionService
from rsigym_env.platform.audit import verify_audit
from rsigym_env.platform.ledger import Ledger
from rsigym_env.programs.sandbox import UNSANDBOXED_ENV
from rsigym_env.worlds.local.sandbox import isolation
from rsigym_env.worlds.recursive.measure import HELD_OUT_SEED_BASE, MAX_K, split_tasks
from rsigym_env.worlds.recursive.world import RecursiveOptions

ADMIN = "test-admin-token-" + secrets.token_hex(8)
SCENARIO = "recursive-scripted-small"          # AIME and GPQA Diamond, $8,000, official_k 1
OPTIONS = {"target": "program",                # the seed program (the scenario's own target is `scripted`)
           "official_seeds": 2}                # 2 validation seeds per benchmark: submit runs 2 x 4 episodes
N_TASKS = 2                                    # dev tasks per evaluation (of the scenario's 4)
GENE = "data_fraction"                         # the STRATEGY gene the improver changes (seed program: 0.4)
CODE = "code/researcher.py"
CALL_LIMIT_S = 50.0                            # every MCP call must return well before a client's ~60 s timeout
TEST_LIMIT_S = 60.0

STATUS_LINE = re.compile(r"\A\[step [^\n]*\]\n")
MORE = re.compile(r"\n\.\.\. \(\d+ more characters; read with @offset to continue\)\Z")
HARNESS = re.compile(r"\b[Hh]arness (h-[0-9a-f]+)")
STARTED = re.compile(r"started as (job-\d+)")
DEV_SCORE = re.compile(r"dev score (-?\d+(?:\.\d+)?)")


needs_sandbox = pytest.mark.skipif(not isolation.bwrap_available(), reason="bubblewrap is not usable here: "
                                   "program researchers run only in their sandbox")


@pytest.fixture(autouse=True)
def sandboxed(monkeypatch):
    """Programs run in their sandbox here, whatever the environment says."""
    monkeypatch.delenv(UNSANDBOXED_ENV, raising=False)


# ------------------------------------------------------------------------------------------------ the service


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``rsigym serve`` in a thread: REST at /v1, MCP at /mcp, on loopback."""
    service = SessionService(tmp_path_factory.mktemp("state"), admin_token=ADMIN)
    mcp_app = mcp_http_app(service.backend_for_key)
    app = create_app(service, mounts={"/mcp": mcp_app}, lifespan=lambda _: mcp_app.lifespan())
    try:
        with serve_in_thread(app) as url:
            yield service, url
    finally:
        service.shutdown()


def create_run(url: str, seed: int, label: str) -> dict[str, Any]:
    """``POST /v1/runs`` as an operator does: a bundled scenario by name, with world-option overrides."""
    response = httpx2.post(f"{url}/v1/runs", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60,
                           json={"scenario": SCENARIO, "world_options": OPTIONS, "seed": seed, "label": label})
    assert response.status_code == 201, response.text
    return response.json()


def held_out() -> dict[str, Any]:
    """What must never reach the client: the validation and test seeds (drawn from the split secret),
    the inner episodes' seeds made from them, and task ids naming them."""
    from rsigym_env.scenario import load_scenario

    opts = RecursiveOptions.model_validate(load_scenario(SCENARIO, world_options=OPTIONS).world_options)
    official, test = split_tasks(opts, "official"), split_tasks(opts, "test")
    seeds = {s for _, s in official} | {s for _, s in test}
    assert official and test and opts.official_split == "secret" and min(seeds) >= HELD_OUT_SEED_BASE
    episodes = {s * MAX_K + j for s in seeds for j in range(MAX_K)}
    return {"task_ids": [f"official/{b}/seed-{s}" for b, s in official] + [f"test/{b}/seed-{s}" for b, s in test],
            "seeds": seeds, "big_seeds": seeds | episodes}


def assert_nothing_held_out(texts: list[str], secret: dict[str, Any]) -> None:
    blob = "\n".join(texts)
    assert "dev/aime/seed-" in blob  # the job results were seen: the check below looks at task ids
    assert not re.search(r"\b(official|test)/[\w.-]+/seed-\d+", blob), "a held-out task id reached the client"
    assert not any(task in blob for task in secret["task_ids"])
    seen = {int(n) for n in re.findall(r"seed-(\d+)", blob)}
    assert not seen & secret["seeds"], f"held-out seeds {sorted(seen & secret['seeds'])} reached the client"
    for n in secret["big_seeds"]:
        assert not re.search(rf"(?<![\d.]){n}(?![\d])", blob), f"test seed {n} reached the client"


def records_after(url: str, key: str, tmp_path: Path) -> list[str]:
    """The run's records over REST with its run key, once the episode is over: the ledger's books balance,
    nothing is still reserved, every inner episode's sub-key is closed and the audit chain is intact. Returns
    the records' texts (the run key may fetch them: they are part of what its holder receives)."""
    auth = {"Authorization": f"Bearer {key}"}
    summary = httpx2.get(f"{url}/v1/ledger", headers=auth, timeout=30).json()
    assert summary["open_reservations"] == [], summary
    subkeys = [a for a in summary["accounts"] if a["parent"] is not None]
    assert subkeys and all(a["closed"] for a in subkeys)  # the measuring episodes ran on sub-keys of the run's key
    data = httpx2.get(f"{url}/v1/ledger.sqlite", headers=auth, timeout=30)
    assert data.status_code == 200
    path = tmp_path / "ledger.sqlite"
    path.write_bytes(data.content)
    with Ledger(path) as ledger:
        books = ledger.books()
    assert books.ok, books.problems
    assert verify_audit(path).ok
    audit = httpx2.get(f"{url}/v1/audit", headers=auth, timeout=30).json()
    assert audit["verified"]["ok"]
    trajectory = httpx2.get(f"{url}/v1/trajectory", headers=auth, timeout=30)
    assert trajectory.status_code == 200
    return [json.dumps(summary), json.dumps(audit), trajectory.text]


# ------------------------------------------------------------------------------------------------ the client


class Seen:
    """Every text an MCP client received (tool list, instructions, results, resources), and each call's time."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.calls: list[tuple[str, float]] = []

    def keep(self, *items: Any) -> None:
        for item in items:
            self.texts.append(item if isinstance(item, str) else json.dumps(item, default=str))

    async def call(self, client: Client, tool: str, args: dict[str, Any]) -> Any:
        started = time.monotonic()
        with anyio.fail_after(CALL_LIMIT_S):
            result = await client.call_tool(tool, args)
        self.calls.append((tool, time.monotonic() - started))
        self.keep(*[c.text for c in result.content if getattr(c, "text", None) is not None], result.structured_content)
        return result

    async def resource(self, client: Client, uri: str) -> dict[str, Any]:
        with anyio.fail_after(CALL_LIMIT_S):
            text = (await client.read_resource(uri)).contents[0].text
        self.keep(text)
        return json.loads(text)


@contextlib.asynccontextmanager
async def mcp_client(url: str, key: str, seen: Seen) -> AsyncIterator[Client]:
    """The SDK's client over streamable HTTP with the run key, timing out as external clients do (60 s)."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        async with Client(streamable_http_client(f"{url}/mcp", http_client=http), read_timeout_seconds=60) as client:
            seen.keep(client.instructions or "", [t.model_dump(mode="json") for t in (await client.list_tools()).tools])
            yield client


def page_body(text: str) -> tuple[str, bool]:
    """A read's page without its status line and "read with @offset" note; whether more follows."""
    status = STATUS_LINE.match(text)
    assert status, text[:200]
    body = text[status.end():]
    more = MORE.search(body)
    return (body[:more.start()], True) if more else (body, False)


def next_offset(ref: str, text: str) -> int | None:
    """Where the next page of ``ref`` (``path`` or ``path@offset``) starts, or ``None`` after the last one."""
    body, more = page_body(text)
    _, _, offset = ref.partition("@")
    return int(offset or 0) + len(body) if more else None


async def read_file(seen: Seen, client: Client, ref: str, max_pages: int = 20) -> str:
    """A harness file of any length, page by page (bounded)."""
    parts: list[str] = []
    page_ref = ref
    for _ in range(max_pages):
        result = await seen.call(client, "read", {"ref": page_ref})
        assert not result.is_error, result.content[0].text
        parts.append(page_body(result.content[0].text)[0])
        offset = next_offset(page_ref, result.content[0].text)
        if offset is None:
            text = "".join(parts)
            assert len(text) == result.structured_content["result"]["chars"]
            return text
        page_ref = f"{ref}@{offset}"
    raise AssertionError(f"{ref} did not end within {max_pages} pages")


# ------------------------------------------------------------------------------------------------ the edit


def load_reference_agent() -> Any:
    """``scripts/mcp_improver.py`` as a module (``scripts/`` is not a package): its literal helpers are the ones
    the test's own agents use, so a program edit is written one way only."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mcp_improver", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "mcp_improver.py"
REFERENCE = load_reference_agent()
set_gene = REFERENCE.set_gene


def strategy(source: str) -> dict[str, Any]:
    """The program's ``STRATEGY`` literal (an error if it has none)."""
    return ast.literal_eval(REFERENCE.literal_node(source, "STRATEGY"))


def edited_program(value: float) -> tuple[str, str]:
    original = builtin_spec("program").code["researcher.py"]
    assert strategy(original)[GENE] != value
    edited = set_gene(original, GENE, value)
    assert strategy(edited) == {**strategy(original), GENE: value}
    return original, edited


def assert_calls_bounded(seen: Seen, started: float) -> None:
    slowest = max(seen.calls, key=lambda c: c[1])
    assert slowest[1] < CALL_LIMIT_S, slowest
    assert time.monotonic() - started < TEST_LIMIT_S


# ------------------------------------------------------------------------------------------------ the bundled scenario


def test_the_bundled_recursive_scenario_serves_the_seed_program_as_harness_files(served):
    """``recursive-scripted`` as bundled (target: program) over MCP: the program's files are harness files an
    edit can replace whole (each under edit_harness's 200,000 characters), and the refusals an improver meets
    first (a program that does not compile, a file that is not part of a spec) are free and say why."""
    service, url = served
    response = httpx2.post(f"{url}/v1/runs", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60,
                           json={"scenario": "recursive-scripted", "seed": 3, "label": "mcp-bundled"})
    assert response.status_code == 201, response.text
    created = response.json()
    seed = builtin_spec("program")
    assert all(len(text) < 200_000 for text in seed.code.values())
    seen = Seen()

    async def look() -> list[Any]:
        async with mcp_client(url, created["run_key"], seen) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert "200,000" in tools["edit_harness"].input_schema["properties"]["content"]["description"]
            listing = await seen.call(client, "read", {"ref": "harness:latest"})
            initial = HARNESS.search(listing.content[0].text).group(1)
            page = await seen.call(client, "read", {"ref": f"harness:latest/{CODE}"})
            was = strategy(seed.code["researcher.py"])[GENE]
            patch = {"path": CODE, "old": f'"{GENE}": {was!r},', "new": f'"{GENE}": 0.6,'}  # the patch route (docs)
            patched = (await seen.call(client, "edit_harness", patch)).structured_content["result"]["version"]
            assert strategy(await read_file(seen, client, f"harness:{patched}/{CODE}"))[GENE] == 0.6
            broken = await seen.call(client, "edit_harness", {"path": CODE, "content": "def make_researcher(params:\n"})
            refused = await seen.call(client, "evaluate", {"k": 1, "n_tasks": 1})
            stray = await seen.call(client, "edit_harness", {"path": "notes.md", "content": "ideas",
                                                             "base_version": initial})
            refused_too = await seen.call(client, "evaluate", {"k": 1, "n_tasks": 1})
            return [listing, page, broken, refused, stray, refused_too]

    try:
        listing, page, broken, refused, stray, refused_too = anyio.run(look)
    finally:
        service.close_run(created["run_id"])
    assert all(f"code/{name}" in listing.content[0].text for name in seed.code)
    body, more = page_body(page.content[0].text)
    assert more and seed.code["researcher.py"].startswith(body)
    assert page.structured_content["result"]["chars"] == len(seed.code["researcher.py"])
    assert not broken.is_error and not stray.is_error  # edits are free and not checked ...
    for result, why in ((refused, "does not compile"), (refused_too, "unexpected file 'notes.md'")):
        assert result.is_error and result.structured_content["error"] == "invalid_harness"  # ... evaluate checks
        assert why in result.structured_content["message"] and result.structured_content["cost_usd"] == 0


# ------------------------------------------------------------------------------------------------ (a) by hand


@needs_sandbox
@pytest.mark.parametrize("value, seed", [(0.6, 10), (0.15, 1)], ids=["more-data", "less-data"])
def test_an_mcp_client_improves_the_seed_program_by_hand(served, tmp_path, value, seed):
    """The test is the agent: read the program, rewrite STRATEGY[GENE], measure both versions, submit the better.
    (The seeds are chosen so that raising data_fraction wins on dev and lowering it loses: both branches.)"""
    service, url = served
    started = time.monotonic()
    created = create_run(url, seed=seed, label="mcp-by-hand")
    assert created["tools"] == ["edit_harness", "evaluate", "read", "wait", "submit"]
    assert CODE in created["briefing"] and "kind program" in created["briefing"]
    original, edited = edited_program(value)
    seen = Seen()

    async def improve() -> dict[str, Any]:
        async with mcp_client(url, created["run_key"], seen) as client:
            async def call(tool: str, args: dict[str, Any]) -> Any:
                result = await seen.call(client, tool, args)
                assert not result.is_error, result.content[0].text
                return result

            briefing = (await seen.resource(client, OBSERVATION_URI))["log"]  # step 0: the briefing
            assert CODE in briefing
            listing = (await call("read", {"ref": "harness:latest"})).content[0].text
            assert CODE in listing and "spec.json" in listing
            initial = HARNESS.search(listing).group(1)
            await call("read", {"ref": "scenario"})  # what any agent reads first
            source = await read_file(seen, client, f"harness:latest/{CODE}")
            assert source == original and len(source) > 8000  # the whole file, over several pages
            changed = set_gene(source, GENE, value)
            assert changed == edited

            wrote = await call("edit_harness", {"path": CODE, "content": changed})
            version = wrote.structured_content["result"]["version"]
            assert version != initial and wrote.structured_content["result"]["base_version"] == initial
            assert await read_file(seen, client, f"harness:{version}/{CODE}") == changed

            jobs, scores = {}, {}
            for harness in (version, initial):  # both jobs run at once; wait for each (bounded: one job each)
                reply = await call("evaluate", {"harness": harness, "k": 1, "n_tasks": N_TASKS})
                jobs[harness] = STARTED.search(reply.content[0].text).group(1)
            for harness, job in jobs.items():
                waited = await seen.call(client, "wait", {"job": job})
                if waited.is_error:  # it finished before this wait (a zero-length job): read it
                    assert waited.structured_content["error"] == "unknown_ref", waited.content[0].text
                result = (await call("read", {"ref": job})).content[0].text
                assert "dev/aime/seed-" in result and "episode_failed" not in result, result  # the program ran
                scores[harness] = float(DEV_SCORE.search(result).group(1))
            assert all(math.isfinite(s) for s in scores.values())

            better = version if scores[version] > scores[initial] else initial  # a tie keeps the original
            submitted_code = await read_file(seen, client, f"harness:{better}/{CODE}")
            done = await call("submit", {"checkpoint": "base", "harness": better})
            for _ in range(5):  # submit may be a job: wait for it (bounded)
                if done.structured_content["done"]:
                    break
                done = await call("wait", {"job": STARTED.search(done.content[0].text).group(1)})
            after = await seen.call(client, "read", {"ref": "budget"})
            assert after.is_error and after.structured_content["error"] == "episode_over"
            return {"done": done.structured_content, "initial": initial, "edited": version, "better": better,
                    "scores": scores, "code": submitted_code}

    out = anyio.run(improve)
    done = out["done"]
    assert done["done"] and done["end"]["end_reason"] == "submitted"
    assert done["end"]["submitted"]["harness"] == out["better"]
    assert isinstance(done["reward"], float) and math.isfinite(done["reward"])
    assert done["reward"] == pytest.approx(done["end"]["normalized_gain"])
    if out["better"] == out["edited"]:  # the submitted program is the edited one
        assert out["code"] == edited != original
    else:  # the original: its code, and no gain by definition
        assert out["code"] == original and done["reward"] == 0.0
    run = service.run_summary(created["run_id"])
    assert run["state"] == "done" and run["reward"] == pytest.approx(done["reward"])
    seen.keep(*records_after(url, created["run_key"], tmp_path))
    assert_nothing_held_out(seen.texts, held_out())
    assert_calls_bounded(seen, started)


# ------------------------------------------------------------------------------------------------ (b) the llm researcher


class ImproverPolicy:
    """The scripted chat model's one turn, played on every request (``ScriptedChatModel([policy],
    repeat_last=True)``): it reads only the last tool message the ``llm`` researcher sent it — the text of
    the MCP result — and answers with the next tool call of the same loop as the test by hand. What went
    wrong in it is kept in ``error`` (the chat server turns it into a 500, and the researcher stops)."""

    def __init__(self, value: float | Any, n_tasks: int | None = N_TASKS) -> None:
        self.value = value                    # the gene's new value, or a function of its value in the read program
        self.n_tasks = n_tasks                # dev tasks per evaluation (None: all of them, so recurse archives both)
        self.state = "start"
        self.ref = ""
        self.parts: list[str] = []
        self.initial = self.edited = self.source = self.better = ""
        self.pending: list[str] = []          # harness versions still to evaluate
        self.jobs: dict[str, str] = {}        # harness version -> its evaluation's job
        self.scores: dict[str, float] = {}
        self.error: BaseException | None = None

    def __call__(self, request: Any) -> Any:
        try:
            last = request.messages[-1]
            return self.turn(last.text if last.role == "tool" else "")
        except BaseException as exc:
            self.error = exc
            raise

    def turn(self, text: str) -> Any:
        from rsigym_env.serving import Call

        state, self.state = self.state, "done"
        if state == "start":
            self.state = "listed"
            return Call("read", {"ref": "harness:latest"})
        if state == "listed":
            self.initial = HARNESS.search(text).group(1)
            self.ref, self.state = f"harness:latest/{CODE}", "paging"
            return Call("read", {"ref": self.ref})
        if state == "paging":
            self.parts.append(page_body(text)[0])
            offset = next_offset(self.ref, text)
            if offset is not None:
                self.ref, self.state = f"harness:latest/{CODE}@{offset}", "paging"
                return Call("read", {"ref": self.ref})
            self.source, self.state = "".join(self.parts), "edited"
            value = self.value(strategy(self.source)[GENE]) if callable(self.value) else self.value
            return Call("edit_harness", {"path": CODE, "content": set_gene(self.source, GENE, value)})
        if state == "edited":
            self.edited = HARNESS.search(text).group(1)
            self.pending = [self.edited, self.initial]
            state, text = "evaluating", ""
        if state == "evaluating":
            if text:
                self.jobs[self.pending.pop(0)] = STARTED.search(text).group(1)
            if self.pending:
                self.state = "evaluating"
                sized = {} if self.n_tasks is None else {"n_tasks": self.n_tasks}
                return Call("evaluate", {"harness": self.pending[0], "k": 1, **sized})
            self.pending, self.state = list(self.jobs), "waited"
            return Call("wait", {"job": self.jobs[self.pending[0]]})
        if state == "waited":  # (an error reply, the job having finished already, is fine too)
            self.state = "read"
            return Call("read", {"ref": self.jobs[self.pending[0]]})
        if state == "read":
            assert "episode_failed" not in text, text  # the program ran in its sandbox
            self.scores[self.pending.pop(0)] = float(DEV_SCORE.search(text).group(1))
            if self.pending:
                self.state = "waited"
                return Call("wait", {"job": self.jobs[self.pending[0]]})
            self.better = self.edited if self.scores[self.edited] > self.scores[self.initial] else self.initial
            self.state = "submitted"
            return Call("submit", {"checkpoint": "base", "harness": self.better})
        if state == "submitted" and (job := STARTED.search(text)):  # submit is a job that is still running
            self.state = "submitted"
            return Call("wait", {"job": job.group(1)})
        return "Submitted."


async def drive_over_mcp(client: Client, seen: Seen, researcher: Any, max_steps: int = 40) -> dict[str, Any]:
    """Run a ``Researcher`` (``reset`` / ``act``) as an MCP agent: its actions are MCP tool calls, each result's
    text its next observation's log (what ``rsigym run`` feeds it from the env). Bounded by ``max_steps``."""
    observation = await seen.resource(client, OBSERVATION_URI)  # at step 0 its log is the briefing
    tools = [t.name for t in (await client.list_tools()).tools]
    info = {"tools": tools, "harness": HARNESS.search(observation["log"]).group(1)}
    await anyio.to_thread.run_sync(lambda: researcher.reset({"log": observation["log"]}, info, seed=0))
    for _ in range(max_steps):
        action = await anyio.to_thread.run_sync(researcher.act, observation, info)
        assert isinstance(action, dict) and isinstance(action.get("args"), dict), action
        result = await seen.call(client, action["tool"], action["args"])
        reply = result.structured_content
        observation = {"log": result.content[0].text, "budget_left_usd": reply["budget_left_usd"], "step": None}
        if reply["done"]:
            return reply
    raise AssertionError(f"the researcher did not submit within {max_steps} steps")


@needs_sandbox
def test_the_llm_researcher_improves_the_seed_program_over_mcp(served, tmp_path):
    from rsigym_env.baselines.llm_researcher import LLMArgs, LLMResearcher
    from rsigym_env.serving import ModelRegistry, OpenAIServer, ScriptedChatModel

    service, url = served
    started = time.monotonic()
    created = create_run(url, seed=12, label="llm-over-mcp")
    original, edited = edited_program(0.6)
    policy = ImproverPolicy(0.6)
    model = ScriptedChatModel([policy], repeat_last=True)
    seen = Seen()
    transcript = tmp_path / "transcript.jsonl"

    with OpenAIServer(ModelRegistry({"improver": model})) as chat:
        researcher = LLMResearcher(LLMArgs(base_url=chat.base_url, api_key="x", model="improver", max_retries=0,
                                           transcript=str(transcript)))

        async def episode() -> dict[str, Any]:
            async with mcp_client(url, created["run_key"], seen) as client:
                return await drive_over_mcp(client, seen, researcher)

        try:
            done = anyio.run(episode)
        finally:
            researcher.close()

    assert policy.error is None and researcher.stop_reason is None, (policy.error, researcher.stop_reason)
    assert policy.source == original  # the model was sent the whole program, page by page
    assert done["done"] and done["end"]["end_reason"] == "submitted"
    assert done["end"]["submitted"]["harness"] == policy.better != ""
    assert isinstance(done["reward"], float) and math.isfinite(done["reward"])
    if policy.better == policy.initial:
        assert done["reward"] == 0.0
    tools = [json.loads(m.model_dump_json()) for m in model.requests[0].tools or []]
    assert {t["function"]["name"] for t in tools} >= {"read", "edit_harness", "evaluate", "wait", "submit"}
    calls = [tool for tool, _ in seen.calls]
    assert calls[0] == "read" and calls.count("evaluate") == 2 and calls[-1] == "submit"
    edit = next(m for r in model.requests for m in r.messages if m.role == "assistant" and m.tool_calls
                and m.tool_calls[0].function.name == "edit_harness")
    assert json.loads(edit.tool_calls[0].function.arguments)["content"] == edited  # sent whole, as written

    assert service.run_summary(created["run_id"])["state"] == "done"
    seen.keep(*records_after(url, created["run_key"], tmp_path))
    sent = [m.text for r in model.requests for m in r.messages]  # everything the chat model was shown
    assert_nothing_held_out(seen.texts + sent + [transcript.read_text()], held_out())
    assert_calls_bounded(seen, started)


def test_the_held_out_check_catches_what_it_looks_for():
    secret = held_out()
    dev = "job-1: dev score 0.3 | dev/aime/seed-1000100  0.2"
    assert_nothing_held_out([dev, "official score 0.28 vs initial 0.27; seeds 0..7 are documented"], secret)
    one, other = sorted(secret["seeds"])[:2]
    for leak in ("official/aime/seed-0", f"official/gpqa-diamond/seed-{one}", f"test/aime/seed-{other}",
                 f"task aime seed-{one} failed", f"\"seed\": {other}", f"episode {one * MAX_K + 1}"):
        with pytest.raises(AssertionError):
            assert_nothing_held_out([dev, leak], secret)


# ------------------------------------------------------------------------------------------------ (c) the round loop


ROUNDS, CHAIN = 2, 0                            # 2 rounds x 1 chain of `rsigym recurse`
RECURSE_LIMIT_S = 150.0


def recurse_with(agent: Any, tmp_path: Path, label: str) -> tuple[dict[str, Any], list[dict[str, Any]], list[bool]]:
    """``recurse`` over 2 rounds x 1 chain of the small scenario (the seed program as target) with ``agent``
    as the improver over MCP; the result, each session's audit and whether each session's books balance."""
    from rsigym_env.archive import Archive
    from rsigym_env.gateway.recursion import AgentImprover
    from rsigym_env.scenario import load_scenario
    from rsigym_env.worlds.recursive import Settings, recurse

    scenario = load_scenario(SCENARIO, world_options=OPTIONS)
    improver = AgentImprover(agent, label=label, timeout_s=RECURSE_LIMIT_S, state_dir=tmp_path / "sessions")
    with improver:
        result = recurse(scenario, rounds=ROUNDS, seeds=[CHAIN], improver=improver,
                         archive=Archive(tmp_path / "archives", f"mcp-{label}"),
                         settings=Settings(imp_k=0, transfer_tracks=()))
        audits = improver.audits()
        books = []
        for session in improver.sessions:
            path = improver.service.runs_dir / session["run_id"] / "ledger.sqlite"
            with Ledger(path) as ledger:
                books.append(ledger.books().ok and not ledger.open_reservations() and verify_audit(path).ok)
        sessions = list(improver.sessions)
    assert [s["state"] for s in sessions] == ["done"] * ROUNDS, sessions
    return result, audits, books


def assert_rounds_judged(result: dict[str, Any], audits: list[dict[str, Any]], books: list[bool], label: str,
                         tmp_path: Path) -> tuple[list[dict[str, Any]], dict[str, Any], Any]:
    """The round loop ran as for a program improver: a row per round naming the outside improver; the archive
    grew in every round by what the agent fully evaluated or submitted; every submission other than the parent
    was validated, paired with its parent, and accepted exactly when the 95 % lower bound of that validation
    gain is above 0; only accepted nodes have a test score; the report carries the rounds; and every session's
    books balance and its audit chain verifies. The rows, the archive's nodes and the archive."""
    from rsigym_env.archive import Archive
    from rsigym_env.worlds.recursive import markdown

    rows = result["rows"]
    assert [(r["seed"], r["round"]) for r in rows] == [(CHAIN, 1), (CHAIN, 2)]
    assert result["config"]["improver"] == f"agent:{label}" and all(r["improver"] == f"agent:{label}" for r in rows)
    archive = Archive(tmp_path / "archives", result["config"]["archives"][0])
    nodes = {n.id: n for n in archive.nodes()}
    for row in rows:
        made = [n for n in nodes.values() if n.produced_by.get("round") == row["round"]]
        assert made and all(n.produced_by["by"] == f"agent:{label}" and n.parent == row["target"] for n in made)
        assert all("train" in n.scores for n in made if n.id != row["submitted"])  # fully evaluated by the agent
        assert row["dev_evaluations"] >= 2 and row["spend_usd"] > 0 and row["steps"] > 0
        assert math.isfinite(row["reward"]) and math.isfinite(row["index_before"]) and math.isfinite(row["index_after"])
        screened = {s["id"]: s for s in row["screened"]}
        if row["submitted"] != row["target"]:
            assert row["submitted"] in screened or nodes[row["submitted"]].status == "duplicate"
        for sid, s in screened.items():
            assert s["accepted"] == (s["low"] is not None and s["low"] > 0)
            assert nodes[sid].status == ("accepted" if s["accepted"] else "rejected")
            assert "validation" in nodes[sid].scores
    assert all(("test" in n.scores) == (n.status == "accepted") for n in nodes.values())
    assert rows[1]["index_before"] == rows[0]["index_after"]
    text = markdown(result, "rsigym recurse (test)")
    assert f"| {CHAIN} | 1 |" in text and f"| {CHAIN} | 2 |" in text and f"agent:{label}" in text
    assert len(audits) == ROUNDS and all(a["verified"]["ok"] and a["records"] for a in audits)
    assert books == [True] * ROUNDS
    return rows, nodes, archive


def test_recurse_refuses_an_outside_agent_as_its_own_improver_and_a_session_that_never_ends(tmp_path):
    """An outside agent cannot be improved by a round (mode 'improver'); an agent that returns without submit,
    or a session that outlives its limit, stops recurse with a clear error, its session closed and settled."""
    from rsigym_env.gateway.recursion import AgentFailed, AgentImprover, ImproverTimeout
    from rsigym_env.scenario import load_scenario
    from rsigym_env.worlds.recursive import Settings, recurse

    for bad, why in (({"timeout_s": 0}, "timeout_s"), ({"timeout_s": True}, "timeout_s"), ({"label": "a b"}, "label"),
                     ({"host": "0.0.0.0"}, "not a loopback address")):
        with pytest.raises(ValueError, match=why):
            AgentImprover(None, **bad)
    scenario = load_scenario(SCENARIO, world_options={"official_seeds": 1, "test_seeds": 1})
    settings = Settings(imp_k=0, transfer_tracks=())
    with AgentImprover(lambda url, key: None, label="lazy", timeout_s=30, state_dir=tmp_path / "a") as lazy:
        with pytest.raises(ValueError, match="mode 'target'"):
            recurse(scenario, rounds=1, seeds=[0], improver=lazy, mode="improver", settings=settings)
        assert lazy.sessions == []  # refused before anything ran
        with pytest.raises(AgentFailed, match="returned without ending the episode"):
            recurse(scenario, rounds=1, seeds=[0], improver=lazy, settings=settings)
        assert lazy.service.run_summary(lazy.sessions[0]["run_id"])["code"] == "improver_failed"
    with AgentImprover(None, label="nobody", timeout_s=0.5, state_dir=tmp_path / "b") as nobody:
        started = time.monotonic()
        with pytest.raises(ImproverTimeout, match="within 0.5 s"):
            recurse(scenario, rounds=1, seeds=[0], improver=nobody, settings=settings)
        assert time.monotonic() - started < 30
        run = nobody.service.run_summary(nobody.sessions[0]["run_id"])
        assert run["state"] == "closed" and run["code"] == "improver_timeout"
        assert nobody.audits()[0]["verified"]["ok"]


def test_recurse_serve_waits_for_whoever_connects_with_the_announced_key(tmp_path):
    """With no agent (``rsigym recurse --serve``) a round only announces its session; a client that connects
    later over REST with the announced key (another process, a person) ends it, and the round goes on."""
    import threading

    from rsigym_env.gateway.recursion import AgentImprover
    from rsigym_env.scenario import load_scenario
    from rsigym_env.worlds.recursive import Settings, recurse

    announced: list[str] = []

    def someone(session: Any) -> None:  # connects a little after the announcement, from another thread
        announced.append(session.announce())

        def drive() -> None:
            time.sleep(0.3)
            auth = {"Authorization": f"Bearer {session.key}"}
            assert httpx2.get(f"{session.rest_url}/observation", headers=auth, timeout=30).status_code == 200
            httpx2.post(f"{session.rest_url}/tools/submit", json={"checkpoint": "base"}, headers=auth, timeout=60)

        threading.Thread(target=drive, daemon=True).start()

    scenario = load_scenario(SCENARIO, world_options={"official_seeds": 1, "test_seeds": 1})
    with AgentImprover(None, label="served", timeout_s=60, on_session=someone, state_dir=tmp_path) as served:
        result = recurse(scenario, rounds=1, seeds=[0], improver=served, settings=Settings(imp_k=0, transfer_tracks=()))
        assert [s["state"] for s in served.sessions] == ["done"] and served.audits()[0]["verified"]["ok"]
    assert len(announced) == 1 and "run key rsr_" in announced[0] and "/mcp" in announced[0]
    assert [(r["round"], r["improver"], r["submitted"] == r["target"]) for r in result["rows"]] == [(1, "agent:served", True)]


IDEAS = [(GENE, lambda v: round(min(0.95, v + 0.15), 2)), ("lora_rank", lambda v: min(128, 2 * v)),  # the test
         ("probe_examples", lambda v: min(200, 2 * v)), ("data_chunks", lambda v: min(6, v + 1)),       # agent's
         ("max_tokens_per_example", lambda v: min(32768, 2 * v)), (GENE, lambda v: round(max(0.05, v - 0.1), 2))]
MAX_EDITS = 3                                   # edits the test agent evaluates per round at most


@needs_sandbox
def test_recurse_with_an_mcp_client_as_the_improver_by_hand(tmp_path):
    """The test is the agent, over the MCP SDK client, in every round: it reads the parent program, evaluates it
    on every train task, then writes and evaluates its next untried ideas (it remembers across rounds, as an
    agent with a memory does) until one beats the parent on dev (at most MAX_EDITS), and submits the best edit."""
    seen = Seen()
    episodes: list[dict[str, Any]] = []
    ideas = list(IDEAS)

    async def agent(mcp_url: str, key: str, context: dict[str, Any]) -> None:  # told its chain and round
        contexts.append(context)
        async with mcp_client(mcp_url.removesuffix("/mcp"), key, seen) as client:
            async def call(tool: str, args: dict[str, Any]) -> Any:
                result = await seen.call(client, tool, args)
                assert not result.is_error, result.content[0].text
                return result

            async def dev_score(version: str) -> float:
                job = STARTED.search((await call("evaluate", {"harness": version, "k": 1})).content[0].text).group(1)
                waited = await seen.call(client, "wait", {"job": job})
                if waited.is_error:  # it finished before this wait
                    assert waited.structured_content["error"] == "unknown_ref", waited.content[0].text
                text = (await call("read", {"ref": job})).content[0].text
                assert "dev/aime/seed-" in text and "episode_failed" not in text, text
                return float(DEV_SCORE.search(text).group(1))

            briefing = (await seen.resource(client, OBSERVATION_URI))["log"]
            assert CODE in briefing and "kind program" in briefing
            initial = HARNESS.search((await call("read", {"ref": "harness:latest"})).content[0].text).group(1)
            source = await read_file(seen, client, f"harness:latest/{CODE}")
            genes = strategy(source)
            scores = {initial: await dev_score(initial)}
            edits: list[str] = []
            while ideas and len(edits) < MAX_EDITS and max(scores.values()) <= scores[initial]:
                gene, change = ideas.pop(0)
                wrote = await call("edit_harness", {"path": CODE, "content": set_gene(source, gene, change(genes[gene])),
                                                    "base_version": initial})
                edits.append(wrote.structured_content["result"]["version"])
                scores[edits[-1]] = await dev_score(edits[-1])
            best = max(edits, key=lambda v: scores[v])
            done = await call("submit", {"checkpoint": "base", "harness": best})
            for _ in range(5):  # submit may be a job: wait for it (bounded)
                if done.structured_content["done"]:
                    break
                done = await call("wait", {"job": STARTED.search(done.content[0].text).group(1)})
            assert done.structured_content["done"]
            after = await seen.call(client, "read", {"ref": "budget"})
            assert after.is_error and after.structured_content["error"] == "episode_over"
            episodes.append({"parent": genes, "scores": scores, "initial": initial, "best": best,
                             "reward": done.structured_content["reward"]})

    started = time.monotonic()
    contexts: list[dict[str, Any]] = []
    result, audits, books = recurse_with(agent, tmp_path, "mcp-by-hand")
    rows, nodes, archive = assert_rounds_judged(result, audits, books, "mcp-by-hand", tmp_path)
    assert len(episodes) == ROUNDS
    assert contexts == [{"chain": CHAIN, "round": r} for r in range(1, ROUNDS + 1)]
    first = episodes[0]
    assert first["scores"][first["best"]] > first["scores"][first["initial"]], first  # an edit wins on dev
    for row, episode in zip(rows, episodes):
        assert row["reward"] == pytest.approx(episode["reward"])  # the round's reward is the session's
        assert row["submitted"] != row["target"] and row["submitted"] in nodes
        assert strategy(archive.rebuild(row["target"])[CODE]) == episode["parent"]  # it was shown the selected parent
    assert_nothing_held_out(seen.texts, held_out())
    assert max(t for _, t in seen.calls) < CALL_LIMIT_S
    assert time.monotonic() - started < RECURSE_LIMIT_S


@needs_sandbox
def test_recurse_with_the_llm_researcher_as_the_improver_over_mcp(tmp_path):
    """The ``llm`` researcher, its chat model scripted and served over real HTTP, improves the parent in every
    round through the MCP SDK client: each tool call an MCP call, each MCP result its tool message."""
    from rsigym_env.baselines.llm_researcher import LLMArgs, LLMResearcher
    from rsigym_env.serving import ModelRegistry, OpenAIServer, ScriptedChatModel

    seen, sent, policies = Seen(), [], []

    async def agent(mcp_url: str, key: str) -> None:
        policy = ImproverPolicy(lambda was: round(min(0.95, was + 0.15 * (len(policies) + 1)), 2), n_tasks=None)
        model = ScriptedChatModel([policy], repeat_last=True)
        policies.append(policy)
        with OpenAIServer(ModelRegistry({"improver": model})) as chat:
            researcher = LLMResearcher(LLMArgs(base_url=chat.base_url, api_key="x", model="improver", max_retries=0))
            try:
                async with mcp_client(mcp_url.removesuffix("/mcp"), key, seen) as client:
                    await drive_over_mcp(client, seen, researcher)
            finally:
                researcher.close()
        assert policy.error is None and researcher.stop_reason is None, (policy.error, researcher.stop_reason)
        sent.extend(m.text for r in model.requests for m in r.messages)

    started = time.monotonic()
    result, audits, books = recurse_with(agent, tmp_path, "llm")
    rows, nodes, archive = assert_rounds_judged(result, audits, books, "llm", tmp_path)
    assert len(policies) == ROUNDS
    for row, policy in zip(rows, policies):
        assert row["dev_evaluations"] == 2  # the model's two evaluations, on every train task
        assert (row["submitted"] == row["target"]) == (policy.better == policy.initial)
        assert archive.rebuild(row["target"])[CODE] == policy.source  # it read the selected parent
    assert_nothing_held_out(seen.texts + sent, held_out())
    assert max(t for _, t in seen.calls) < CALL_LIMIT_S
    assert time.monotonic() - started < RECURSE_LIMIT_S


REST_AGENT = '''
import json, os, re, httpx
rest, key = os.environ["RSIGYM_REST_URL"], os.environ["RSIGYM_RUN_KEY"]
config = json.load(open(os.environ["RSIGYM_MCP_CONFIG"]))["mcpServers"]["rsigym"]
assert config["url"] == os.environ["RSIGYM_MCP_URL"] and config["headers"]["Authorization"] == "Bearer " + key
auth = {"Authorization": "Bearer " + key}
def call(tool, args):
    return httpx.post(f"{rest}/tools/{tool}", json=args, headers=auth, timeout=60).json()
job = call("evaluate", {"k": 1})["result"]["job"]
call("wait", {"job": job})
reply = call("submit", {"checkpoint": "base"})
for _ in range(5):
    if reply["done"]:
        break
    reply = call("wait", {"job": re.search(r"started as (job-[0-9]+)", reply["text"]).group(1)})
print("agent done:", reply["done"])
'''


def test_cli_recurse_runs_an_improver_command_per_round_and_stops_clearly_when_it_does_not_submit(tmp_path, capfd):
    """``rsigym recurse --improver-command``: the command runs once per round with its session in its environment
    (here a REST agent that evaluates once and submits), and the rounds are reported as for any improver; a command
    that does not submit, a session nobody drives past --improver-timeout, and flags that contradict an outside
    improver each stop it with a clear error."""
    import shlex
    import sys

    from rsigym_env.cli import main

    agent = tmp_path / "agent.py"
    agent.write_text(REST_AGENT)
    base = ["recurse", "--scenario", SCENARIO, "--rounds", "2", "--seeds", "1", "--imp-k", "0"]
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(agent))}"
    assert main(base + ["--improver-command", command, "--out", str(tmp_path / "o")]) == 0
    out = capfd.readouterr().out
    assert out.count("improver session ") == 2 and out.count("agent done: True") == 2
    data = json.loads((tmp_path / "o" / "recursion.json").read_text())
    assert [(r["round"], r["improver"], r["dev_evaluations"]) for r in data["rows"]] == [(1, "agent:command", 1),
                                                                                          (2, "agent:command", 1)]
    assert "--improver-command" in data["config"]["command"] and "rsr_" not in data["config"]["command"]
    assert main(base + ["--improver-command", "exit 0", "--out", str(tmp_path / "x")]) == 3
    assert "returned without ending the episode" in capfd.readouterr().out
    assert main(base + ["--serve", "--improver-timeout", "0.5", "--out", str(tmp_path / "y")]) == 3
    assert "within 0.5 s: no submit" in " ".join(capfd.readouterr().out.split())
    assert main(base + ["--serve", "--mode", "improver"]) == 2
    assert main(base + ["--serve", "--improver-timeout", "0"]) == 2
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_an_improver_command_never_inherits_the_held_out_split_secret_or_nonce(monkeypatch, tmp_path):
    """An agent that dumps its environment (what a curious coding agent does first) finds its session there, its
    own variables, and neither the split secret nor an episode draw's nonce, even when the platform pinned both."""
    from rsigym_env.gateway.recursion import command_agent

    monkeypatch.setenv("RSIGYM_SPLIT_SECRET", "pinned-secret-xyz")
    monkeypatch.setenv("RSIGYM_SPLIT_NONCE", "pinned-nonce-xyz")
    monkeypatch.setenv("MY_AGENT_API_KEY", "mine")
    dump = tmp_path / "env.txt"
    command_agent(f"env > {dump}")("http://127.0.0.1:1/mcp", "rsr_k", mcp_config="/dev/null")
    seen = dump.read_text()
    assert "RSIGYM_RUN_KEY=rsr_k" in seen and "MY_AGENT_API_KEY=mine" in seen
    assert "pinned-secret-xyz" not in seen and "pinned-nonce-xyz" not in seen


def test_an_improver_command_is_told_its_chain_and_round_and_nothing_stale(monkeypatch, tmp_path):
    """A command learns where its episode stands (chain, round) to keep its memory per chain; a value left in
    the parent's environment (a command started from inside another run) never passes for the current one."""
    from rsigym_env.gateway.recursion import command_agent

    monkeypatch.setenv("RSIGYM_IMPROVER_CHAIN", "99")
    monkeypatch.setenv("RSIGYM_IMPROVER_MEMORY", "mine.json")  # the agent's own setting: kept
    dump = tmp_path / "env.txt"
    agent = command_agent(f"env > {dump}")
    agent("http://127.0.0.1:1/mcp", "rsr_k", mcp_config="/dev/null", context={"chain": 4, "round": 2})
    seen = [line for line in dump.read_text().splitlines() if line.startswith("RSIGYM_IMPROVER_")]
    assert sorted(seen) == ["RSIGYM_IMPROVER_CHAIN=4", "RSIGYM_IMPROVER_MEMORY=mine.json", "RSIGYM_IMPROVER_ROUND=2"]
    agent("http://127.0.0.1:1/mcp", "rsr_k", mcp_config="/dev/null")
    seen = [line for line in dump.read_text().splitlines() if line.startswith("RSIGYM_IMPROVER_")]
    assert seen == ["RSIGYM_IMPROVER_MEMORY=mine.json"]


@needs_sandbox
def test_an_improver_command_cannot_read_the_secret_or_the_books_see_other_processes_or_change_the_package(
        monkeypatch, tmp_path):
    """A hostile improver command, run as this user, hunts for what would let it select on held-out scores or
    forge results: the split secret's key file under ``$RSIGYM_HOME``, the sessions' ledgers, the processes of
    ``rsigym recurse`` (their memory and environment), and the package's code (to plant code that later
    evaluations run). It finds none of them, and still gets its MCP config and its network."""
    import rsigym_env
    from rsigym_env.gateway.recursion import command_agent
    from rsigym_env.splits import SECRET_FILE

    home = tmp_path / "home"
    monkeypatch.setenv("RSIGYM_HOME", str(home))
    (home / "secrets").mkdir(parents=True)
    (home / "secrets" / SECRET_FILE).write_text("the-platform-split-secret\n")
    books = tmp_path / "sessions"
    (books / "runs" / "r1").mkdir(parents=True)
    (books / "runs" / "r1" / "ledger.jsonl").write_text('{"entry": "books"}\n')
    config = books / "runs" / "r1" / "mcp-client.json"
    config.write_text('{"mcpServers": {"rsigym": {}}}')
    package = Path(rsigym_env.__file__).parent
    seen = tmp_path / "seen"
    seen.mkdir()
    hunt = f"""
        cat "$RSIGYM_HOME/secrets/{SECRET_FILE}" > {seen}/secret 2>&1
        cat {books}/runs/r1/ledger.jsonl > {seen}/books 2>&1
        cat "$RSIGYM_MCP_CONFIG" > {seen}/config 2>&1
        cat /proc/{os.getpid()}/environ > {seen}/parent 2>&1
        ls /proc | grep -c '^[0-9]' > {seen}/processes
        {{ echo 'X = 1' > {package}/planted_by_agent.py; }} 2> {seen}/planted
        echo hunted > {seen}/done
    """
    command_agent(hunt)("http://127.0.0.1:1/mcp", "rsr_k", mcp_config=str(config), hidden=[str(books)])
    read = {p.name: p.read_text() for p in seen.iterdir()}
    assert read["done"] == "hunted\n"
    assert "the-platform-split-secret" not in read["secret"] and "No such file" in read["secret"]
    assert "books" not in read["books"] and read["config"] == config.read_text()
    assert "No such file" in read["parent"] and int(read["processes"]) < 10  # a PID namespace of its own
    assert not (package / "planted_by_agent.py").exists() and "Read-only file system" in read["planted"]


@needs_sandbox
def test_cli_recurse_with_the_reference_mcp_improver_script(served, tmp_path, monkeypatch, capfd):
    """``scripts/mcp_improver.py`` as ``rsigym recurse --improver-command``: in each round it reads the parent,
    evaluates it and untried single-gene edits on dev and submits the best; its memory file carries what it tried
    into the next round (no edit evaluated twice from the same value), the rounds are reported and the archive
    grows. Run with a key the service does not know, it stops with a clear message and status 2."""
    import shlex
    import subprocess
    import sys

    from rsigym_env.archive import Archive
    from rsigym_env.cli import main

    script = SCRIPT
    memory = tmp_path / "memory.json"
    monkeypatch.setenv("RSIGYM_HOME", str(tmp_path / "home"))
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} --memory {shlex.quote(str(memory))}"
    started = time.monotonic()
    assert main(["recurse", "--scenario", SCENARIO, "--target", "program", "--rounds", "2", "--seeds", "1",
                 "--imp-k", "0", "--archive", "mcp-script", "--out", str(tmp_path / "o"),
                 "--improver-command", command]) == 0
    seconds = time.monotonic() - started
    out = capfd.readouterr().out
    assert out.count("[mcp_improver] submitted ") == 2, out[-3000:]
    data = json.loads((tmp_path / "o" / "recursion.json").read_text())
    rows = data["rows"]
    assert [(r["round"], r["improver"]) for r in rows] == [(1, "agent:command"), (2, "agent:command")]
    assert not memory.exists()  # one memory per chain: this run's one chain is chain 0
    remembered = json.loads((tmp_path / "memory.chain-0.json").read_text())
    assert len(remembered["rounds"]) == 2
    tried = [(t["gene"], json.dumps(t["from"]), json.dumps(t["value"])) for t in remembered["tried"]]
    assert len(tried) == sum(r["dev_evaluations"] - 1 for r in rows) >= 2  # the parent and >= 1 edit per round
    assert len(set(tried)) == len(tried)  # the memory kept round 2 off round 1's edits
    for row, played in zip(rows, remembered["rounds"]):
        assert row["dev_evaluations"] >= 2 and row["spend_usd"] > 0
        assert (row["submitted"] == row["target"]) == (played["submitted"] == played["parent"])
        assert played["best_dev"] >= played["dev"]  # it submits the best it measured, or the parent
    nodes = Archive(tmp_path / "home" / "archives", data["config"]["archives"][0]).nodes()
    assert len(nodes) == 1 + sum(r["dev_evaluations"] - 1 for r in rows)  # the root and every edit it evaluated
    assert all(n.produced_by.get("by") == "agent:command" for n in nodes if n.parent is not None)
    print(f"2 rounds of {SCENARIO} with scripts/mcp_improver.py: {seconds:.1f} s")
    for url, why in ((f"{served[1]}/mcp", "HTTP 401 (the run key was refused)"),  # a key the service does not know
                     ("http://127.0.0.1:9/mcp", "ConnectError")):                  # nobody there
        refused = subprocess.run([sys.executable, str(script), "--memory", str(tmp_path / "m2.json")],
                                 capture_output=True, text=True, timeout=60,
                                 env={**os.environ, "RSIGYM_MCP_URL": url, "RSIGYM_RUN_KEY": "rsr_nobody"})
        assert refused.returncode == 2 and refused.stderr.startswith("mcp_improver: "), refused.stderr[-2000:]
        assert why in refused.stderr and "Traceback" not in refused.stderr and "rsr_nobody" not in refused.stderr
        print(refused.stderr.strip())


def test_the_reference_mcp_improver_proposes_untried_single_gene_edits_within_the_programs_ranges(tmp_path):
    """``scripts/mcp_improver.py``'s proposals on the seed program: single-gene edits inside RANGES/ALLELES, each
    one a valid program differing in that gene only; with its memory of a round, the next round proposes none of
    the same edits again and puts a gene that gained first; its docstring examples run; a file that is not its
    memory is refused."""
    import doctest

    agent = REFERENCE
    assert doctest.testmod(agent).failed == 0
    source = builtin_spec("program").code["researcher.py"]
    genes, ranges, alleles = (agent.literal(source, n) for n in ("STRATEGY", "RANGES", "ALLELES"))
    memory = agent.load_memory(tmp_path / "none-yet.json")
    first = agent.propose(genes, ranges, alleles, memory, 4)
    assert len(first) == 4 and len({g for g, _ in first}) == 4
    for gene, value in first:
        edited = agent.literal(agent.set_gene(source, gene, value), "STRATEGY")
        assert edited == {**genes, gene: value} and value != genes[gene]
        assert (ranges[gene][0] <= value <= ranges[gene][1]) if gene in ranges else value in alleles[gene]
    memory["tried"] = [{"gene": g, "value": v, "from": genes[g], "gain": 0.1 * (i == 1) - 0.05}
                       for i, (g, v) in enumerate(first)]
    agent.save_memory(tmp_path / "m.json", memory)
    second = agent.propose(genes, ranges, alleles, agent.load_memory(tmp_path / "m.json"), 4)
    assert not set(map(repr, second)) & set(map(repr, first))
    assert first[1][0] == "fix_harness" and second[0][0] == "fix_harness"  # it gained: first again, another allele
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not this agent's memory file"):
        agent.load_memory(tmp_path / "bad.json")


@needs_sandbox
def test_the_reference_mcp_improver_stops_editing_when_the_budget_cannot_cover_another_evaluation(served, tmp_path):
    """With money for one dev evaluation only ($2,100: an evaluation reserves 4 dev tasks x $500 as its worst
    case), ``scripts/mcp_improver.py`` evaluates the parent, has its next evaluation refused (free), records no
    gain it did not measure, and still ends the episode by submitting the parent."""
    import subprocess
    import sys

    response = httpx2.post(f"{served[1]}/v1/runs", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60,
                           json={"scenario": SCENARIO, "world_options": OPTIONS, "seed": 11, "label": "mcp-script-poor",
                                 "budget_usd": 2100})
    assert response.status_code == 201, response.text
    key = response.json()["run_key"]
    script = SCRIPT
    memory = tmp_path / "memory.json"
    done = subprocess.run([sys.executable, str(script), "--memory", str(memory)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "RSIGYM_MCP_URL": f"{served[1]}/mcp", "RSIGYM_RUN_KEY": key})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "does not cover another evaluation" in done.stdout, done.stdout
    remembered = json.loads(memory.read_text())
    assert remembered["tried"] == []
    [played] = remembered["rounds"]
    assert played["submitted"] == played["parent"] and played["edit"] is None and played["dev"] is not None
    summary = httpx2.get(f"{served[1]}/v1/ledger", headers={"Authorization": f"Bearer {key}"}, timeout=30).json()
    assert summary["open_reservations"] == []
    status = httpx2.get(f"{served[1]}/v1/observation", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert status.status_code != 200 or status.json().get("done") is True
