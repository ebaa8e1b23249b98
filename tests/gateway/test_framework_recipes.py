"""docs/agents.md, "Agent frameworks": each framework's recipe there, run as written against a real
`rsigym mcp --scenario sim-joint-aime-500 --seed 3` (the venv's entry point, over stdio) or a session
service's `/mcp` (over streamable HTTP), driven by a deterministic scripted model, to `submit` and a real
reward in the run's result. The OpenAI Agents SDK's episode is `test_openai_agents_sdk_...` in
test_gateway_mcp.py."""

from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from gateway_helpers import serve_in_thread
from rsigym_env.tools import TOOL_NAMES

RSIGYM = str(Path(sys.executable).with_name("rsigym"))  # the venv's `rsigym`, as the docs' "rsigym"
SCENARIO = ["mcp", "--scenario", "sim-joint-aime-500", "--seed", "3"]  # seed 3: a system whose replies get cut off, so the fix pays (sim result version 5)
FIX = {"path": "harness.toml", "old": 'on_truncation = "stop"', "new": 'on_truncation = "continue"'}
# an episode that gains: evaluate the initial harness, fix it, evaluate again, submit
EPISODE: list[tuple[str, dict[str, Any]]] = [
    ("evaluate", {"k": 1}), ("wait", {}), ("edit_harness", FIX), ("evaluate", {"k": 1}), ("wait", {}), ("submit", {})]
# two refusals in a row of one tool (a malformed argument, then one out of range): what small models do
REFUSALS: list[tuple[str, dict[str, Any]]] = [("evaluate", {"k": "two"}), ("evaluate", {"k": 99})]


def server_env() -> dict[str, str]:
    """This environment without a session service's variables (the run comes from the flags anyway)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("RSIGYM_")}


def submitted(run_dir: Path, *, refusals: int = 0) -> dict[str, Any]:
    """The run's result.json: the episode ended by submit, with a positive reward."""
    result = json.loads((run_dir / "result.json").read_text())
    assert result["scenario"] == "sim-joint-aime-500" and result["seed"] == 3 and result["terminated"]
    info = result["info"]
    assert info["end_reason"] == "submitted" and info["refusals"] == refusals and info["dev_evaluations"] == 2
    assert result["reward"] == pytest.approx(info["normalized_gain"]) and result["reward"] > 0
    return result


# ------------------------------------------------------------------------------------------------ pydantic-ai


def pydantic_ai_model(script: list[tuple[str, dict[str, Any]] | str], seen: list[Any]) -> Any:
    """pydantic-ai's FunctionModel answering each request with the script's next tool call (or text)."""
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def respond(messages: list[Any], info: AgentInfo) -> ModelResponse:
        seen.append((messages[-1], [t.name for t in info.function_tools]))
        step = script.pop(0)
        if isinstance(step, str):
            return ModelResponse(parts=[TextPart(step)])
        return ModelResponse(parts=[ToolCallPart(step[0], step[1])])

    return FunctionModel(respond)


def pydantic_ai_episode(run_dir: Path, script: list[Any], seen: list[Any], **toolset_options: Any) -> Any:
    """The recipe: `rsigym mcp` as an MCPToolset over stdio, one agent run to the end of the episode."""
    from fastmcp.client.transports import StdioTransport
    from pydantic_ai import Agent
    from pydantic_ai.mcp import MCPToolset
    from pydantic_ai.usage import UsageLimits

    rsigym = MCPToolset(StdioTransport(RSIGYM, [*SCENARIO, "--run-dir", str(run_dir)], env=server_env()),
                        init_timeout=60, **toolset_options)
    agent = Agent(pydantic_ai_model(script, seen), toolsets=[rsigym],
                  instructions="Improve the target system, then submit.")

    async def main() -> Any:
        async with agent:  # one connection (one server process, one run) for the whole episode
            return await agent.run("Start the research run.", usage_limits=UsageLimits(request_limit=250))

    return anyio.run(main)


@pytest.mark.parametrize("fix", [{"tool_error_behavior": "failed"}, {"max_retries": 5}], ids=["failed", "max_retries"])
def test_pydantic_ai_recipe_survives_two_refusals_in_a_row_and_submits(tmp_path, fix):
    from pydantic_ai.messages import ToolReturnPart

    script: list[Any] = [*REFUSALS, *EPISODE, "Submitted the fixed harness."]
    seen: list[Any] = []
    result = pydantic_ai_episode(tmp_path / "run", script, seen, **fix)

    assert result.output == "Submitted the fixed harness." and script == []
    assert sorted(seen[0][1]) == sorted(TOOL_NAMES)  # the agent offered the model exactly the MCP tools
    answers = [request.parts[0] for request, _ in seen[1:]]
    refused = answers[:2]
    outcome = "failed" if "tool_error_behavior" in fix else "retried"
    assert all(isinstance(a, ToolReturnPart) and a.outcome == outcome for a in refused), refused
    assert all("invalid_args" in str(a.content) for a in refused)  # the refusals reached the model
    assert "started as job-1" in str(answers[2].content) and "job-1 (evaluate) finished" in str(answers[3].content)
    assert "normalized gain +0." in str(answers[7].content)
    submitted(tmp_path / "run", refusals=2)


def test_pydantic_ai_default_retries_abort_the_run_on_two_refusals_in_a_row(tmp_path):
    """The pitfall the docs name: with the defaults (retries=1), the second refusal of one tool in a row
    ends agent.run with UnexpectedModelBehavior, and the episode is left unfinished."""
    from pydantic_ai.exceptions import UnexpectedModelBehavior

    script: list[Any] = [*REFUSALS, *EPISODE]
    with pytest.raises(UnexpectedModelBehavior, match="Tool 'evaluate' exceeded max retries count of 1"):
        pydantic_ai_episode(tmp_path / "run", script, [])
    assert script == EPISODE and not (tmp_path / "run" / "result.json").exists()


# ------------------------------------------------------------------------------------------------ LangGraph


def langchain_model(script: list[tuple[str, dict[str, Any]] | str]) -> Any:
    """A chat model answering each call with the script's next tool call (or text); it records what
    `bind_tools` was given (the tools' names, and the tool_choice LangChain sent)."""
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.utils.function_calling import convert_to_openai_tool

    class ScriptedChat(BaseChatModel):
        script: list[Any]
        bound: list[dict[str, Any]] = []
        seen: list[list[Any]] = []

        @property
        def _llm_type(self) -> str:
            return "scripted"

        def bind_tools(self, tools: Any, *, tool_choice: Any = None, **kwargs: Any) -> Any:
            names = [convert_to_openai_tool(t)["function"]["name"] for t in tools]
            self.bound.append({"tools": names, "tool_choice": tool_choice})
            return self

        def _generate(self, messages: list[Any], stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
            self.seen.append(list(messages))
            step = self.script.pop(0)
            if isinstance(step, str):
                message = AIMessage(content=step)
            else:
                message = AIMessage(content="", tool_calls=[
                    {"name": step[0], "args": step[1], "id": f"call-{len(self.seen)}", "type": "tool_call"}])
            return ChatResult(generations=[ChatGeneration(message=message)])

    return ScriptedChat(script=script, bound=[], seen=[])


def tool_answers(messages: list[Any]) -> list[tuple[str, str, str]]:
    """(tool, status, text) of each ToolMessage of a LangGraph agent's final state."""
    from langchain_core.messages import ToolMessage

    return [(m.name, m.status, m.content if isinstance(m.content, str) else json.dumps(m.content))
            for m in messages if isinstance(m, ToolMessage)]


async def langchain_tools(session: Any) -> list[Any]:
    """The docs' converter: LangChain tools calling the MCP tools of one held ``mcp`` ClientSession
    (langchain-mcp-adapters 0.3 imports only with mcp<2; rsigym's environment has mcp 2)."""
    from langchain_core.tools import StructuredTool, ToolException

    def tool(spec: Any) -> Any:
        async def call(**args: Any) -> str:
            result = await session.call_tool(spec.name, args)
            if result.is_error:  # a refusal: the model reads it as the tool's (error) answer
                raise ToolException(result.content[0].text)
            return result.content[0].text

        return StructuredTool(name=spec.name, description=spec.description or "", args_schema=spec.input_schema,
                              coroutine=call, handle_tool_error=True)

    return [tool(spec) for spec in (await session.list_tools()).tools]


def test_langgraph_agent_holds_one_session_and_one_run_to_submit(tmp_path):
    from langchain.agents import create_agent
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    run_dir = tmp_path / "run"
    model = langchain_model([*REFUSALS, *EPISODE, "Submitted the fixed harness."])
    server = StdioServerParameters(command=RSIGYM, args=[*SCENARIO, "--run-dir", str(run_dir)], env=server_env())

    async def main() -> dict[str, Any]:
        async with stdio_client(server) as (read, write), ClientSession(read, write) as session:  # one run
            await session.initialize()
            agent = create_agent(model, await langchain_tools(session),
                                 system_prompt="Improve the target system, then submit.")
            return await agent.ainvoke({"messages": [("user", "Start the research run.")]})

    state = anyio.run(main)
    assert state["messages"][-1].content == "Submitted the fixed harness." and model.script == []
    assert model.bound[0]["tool_choice"] is None  # LangChain sends no tool_choice unless asked (see the docs)
    assert model.bound[0]["tools"] == list(TOOL_NAMES)
    answers = tool_answers(state["messages"])
    assert [(tool, status) for tool, status, _ in answers[:2]] == [("evaluate", "error")] * 2  # refusals: answers
    assert all("invalid_args" in text for _, _, text in answers[:2])
    assert "started as job-1" in answers[2][2]
    assert "job-1 (evaluate) finished" in answers[3][2]  # the next wait found evaluate's job: the same run
    assert "normalized gain +0." in answers[7][2]
    submitted(run_dir, refusals=2)


def test_langgraph_agent_sends_tool_choice_auto_through_a_middleware():
    """The docs' fix for servers that ignore tools without a tool_choice (llama-cpp-python's)."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import wrap_model_call
    from langchain_core.tools import StructuredTool

    @wrap_model_call
    async def tool_choice_auto(request: Any, handler: Any) -> Any:
        return await handler(request.override(tool_choice="auto"))

    async def evaluate(k: int) -> str:
        return f"evaluate k={k}"

    model = langchain_model([("evaluate", {"k": 1}), "done"])
    agent = create_agent(model, [StructuredTool.from_function(coroutine=evaluate, name="evaluate", description="e")],
                         middleware=[tool_choice_auto])
    state = anyio.run(agent.ainvoke, {"messages": [("user", "go")]})
    assert [b["tool_choice"] for b in model.bound] == ["auto", "auto"] and state["messages"][-1].content == "done"
    assert tool_answers(state["messages"]) == [("evaluate", "success", "evaluate k=1")]


# The docs' langchain-mcp-adapters recipe, as a script for a Python that has the package: this venv once
# an adapters release supports mcp 2, else the one LANGCHAIN_MCP_PYTHON names (a venv with
# `pip install "langchain-mcp-adapters==0.3.*" "langchain==1.5.*"`, mcp 1.x). argv: rsigym, run dir, /mcp URL, key.
ADAPTERS_SCRIPT = r"""
import json, os, sys
import anyio
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_mcp_adapters.client import MultiServerMCPClient
from langchain_mcp_adapters.tools import load_mcp_tools

RSIGYM, RUN_DIR, URL, KEY = sys.argv[1:5]
SCRIPT = json.loads(sys.stdin.read())

class ScriptedChat(BaseChatModel):
    script: list
    @property
    def _llm_type(self):
        return "scripted"
    def bind_tools(self, tools, *, tool_choice=None, **kwargs):
        return self
    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        step = self.script.pop(0)
        message = AIMessage(content=step) if isinstance(step, str) else AIMessage(content="", tool_calls=[
            {"name": step[0], "args": step[1], "id": f"call-{len(self.script)}", "type": "tool_call"}])
        return ChatResult(generations=[ChatGeneration(message=message)])

def answers(state):
    return [[m.name, m.status, json.dumps(m.content)] for m in state["messages"] if isinstance(m, ToolMessage)]

env = {k: v for k, v in os.environ.items() if not k.startswith("RSIGYM_")}
args = ["mcp", "--scenario", "sim-joint-aime-500", "--seed", "3"]

async def main():
    out = {}
    client = MultiServerMCPClient({"rsigym": {"transport": "stdio", "command": RSIGYM,
                                              "args": [*args, "--run-dir", RUN_DIR], "env": env}})
    async with client.session("rsigym") as session:  # the recipe: one process, one run
        agent = create_agent(ScriptedChat(script=list(SCRIPT)), await load_mcp_tools(session))
        out["held"] = answers(await agent.ainvoke({"messages": [("user", "Start the research run.")]}))
    quickstart = MultiServerMCPClient({"rsigym": {"transport": "stdio", "command": RSIGYM, "args": args, "env": env}})
    tools = {t.name: t for t in await quickstart.get_tools()}  # the pitfall: a new process per call
    out["quickstart"] = [json.dumps(await tools["evaluate"].ainvoke({"k": 1})), json.dumps(await tools["wait"].ainvoke({}))]
    served = MultiServerMCPClient({"rsigym": {"transport": "streamable_http", "url": URL,
                                              "headers": {"Authorization": f"Bearer {KEY}"}}})
    agent = create_agent(ScriptedChat(script=[s for s in SCRIPT if s[0] != "evaluate" or s[1] == {"k": 1}]),
                         await served.get_tools())  # over HTTP the run is the key's: a session per call is fine
    out["http"] = answers(await agent.ainvoke({"messages": [("user", "Start the research run.")]}))
    print(json.dumps(out))

anyio.run(main)
"""


def adapters_python() -> str:
    named = os.environ.get("LANGCHAIN_MCP_PYTHON")
    if named:
        return named
    try:
        import langchain_mcp_adapters.client  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"langchain-mcp-adapters does not import here ({exc}); set LANGCHAIN_MCP_PYTHON to a Python "
                    "that has it (its releases so far need mcp<2)")
    return sys.executable


@pytest.mark.slow
def test_langchain_mcp_adapters_recipe_held_session_quickstart_pitfall_and_http(tmp_path):
    import subprocess

    from rsigym_env.gateway.mcp_server import mcp_http_app
    from rsigym_env.gateway.rest import create_app
    from rsigym_env.gateway.service import RunRequest, SessionService

    python, run_dir = adapters_python(), tmp_path / "run"
    service = SessionService(tmp_path / "state", admin_token=secrets.token_urlsafe(24))
    try:
        key = service.create_run(RunRequest(scenario="sim-joint-aime-500", seed=3))["run_key"]
        mcp_app = mcp_http_app(service.backend_for_key)
        app = create_app(service, mounts={"/mcp": mcp_app}, lifespan=lambda _: mcp_app.lifespan())
        with serve_in_thread(app) as url:
            done = subprocess.run([python, "-c", ADAPTERS_SCRIPT, RSIGYM, str(run_dir), f"{url}/mcp", key],
                                  input=json.dumps([*REFUSALS, *EPISODE, "Submitted."]), capture_output=True,
                                  text=True, timeout=120, cwd=tmp_path)
            assert done.returncode == 0, done.stderr[-3000:]
        end = service.backend_for_key(key).observation()["end"]
    finally:
        service.shutdown()
    out = json.loads(done.stdout.splitlines()[-1])
    held = out["held"]
    assert [(tool, status) for tool, status, _ in held[:2]] == [("evaluate", "error")] * 2
    assert "started as job-1" in held[2][2] and "job-1 (evaluate) finished" in held[3][2]  # one session: one run
    submitted(run_dir, refusals=2)
    started, waited = out["quickstart"]
    assert "started as job-1" in started and "no_running_jobs" in waited  # get_tools() over stdio: a run per call
    assert [tool for tool, _, _ in out["http"]] == [tool for tool, _ in EPISODE]
    assert "job-1 (evaluate) finished" in out["http"][1][2]
    assert end["end_reason"] == "submitted" and end["normalized_gain"] > 0


# ------------------------------------------------------------------------------------------------ the mcp SDK


def test_mcp_sdk_client_session_recipe_plays_an_episode(tmp_path):
    """The low-level recipe: ClientSession over stdio_client (test_gateway_mcp.py drives `mcp.Client`)."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    run_dir = tmp_path / "run"
    server = StdioServerParameters(command=RSIGYM, args=[*SCENARIO, "--run-dir", str(run_dir)], env=server_env())

    async def main() -> list[Any]:
        async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            assert [t.name for t in (await session.list_tools()).tools] == list(TOOL_NAMES)
            return [await session.call_tool(tool, args) for tool, args in [*REFUSALS, *EPISODE]]

    results = anyio.run(main)
    assert [r.is_error for r in results] == [True, True] + [False] * len(EPISODE)
    assert results[0].structured_content["error"] == "invalid_args"
    done = results[-1].structured_content
    assert done["done"] and done["reward"] == submitted(run_dir, refusals=2)["reward"]
