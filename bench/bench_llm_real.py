"""The real-model path (issue 29): SmolLM2-135M-Instruct via llama-cpp-python, served by the project's
OpenAI-compatible server, plays ``llm``-researcher episodes on the sim (aime, $500, 10 steps).

Reports decoding speed (tokens generated per second of generation, prompt processing included), the
episode's wall time, and, as the reference measured in the same run, the wall time of a scripted
researcher's episode on the same scenario (the ratio is what the model costs over the env itself).
Needs the ``llm-real`` extra (``make test-llm`` installs it).

    .venv/bin/python bench/bench_llm_real.py [--seeds 2] [--max-steps 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import rsigym_env  # noqa: F401  (registers the ids)
import gymnasium as gym

from rsigym_env.baselines import LLMArgs, LLMResearcher, make_researcher
from rsigym_env.episode import run_episode
from rsigym_env.serving import ModelRegistry, OpenAIServer
from rsigym_env.serving.gguf import GGUFChatModel, smollm2_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=10)
    args = parser.parse_args(argv)
    load0 = os.getloadavg()
    started = time.perf_counter()
    model = GGUFChatModel(smollm2_path(), n_ctx=8192, n_threads=2)
    load_s = time.perf_counter() - started
    rows = []
    with OpenAIServer(ModelRegistry({"smollm2": model})) as server, tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            env = gym.make("RSIGym/Joint-v0", benchmark="aime", budget_usd=500, max_steps=args.max_steps)
            t0 = time.perf_counter()
            run_episode(env, make_researcher("scripted"), seed=seed)
            scripted_s = time.perf_counter() - t0
            tokens0, gen0 = model.generated_tokens, model.generate_seconds
            researcher = LLMResearcher(LLMArgs(model="smollm2", base_url=server.url + "/v1", api_key="local",
                                               temperature=0.0, max_tokens=160,
                                               transcript=str(Path(tmp) / f"t{seed}.jsonl"),
                                               context_tokens=model.context_length))
            t0 = time.perf_counter()
            result = run_episode(env, researcher, seed=seed)
            wall = time.perf_counter() - t0
            env.close()
            tokens, gen = model.generated_tokens - tokens0, model.generate_seconds - gen0
            rows.append({"seed": seed, "wall_s": wall, "scripted_s": scripted_s, "tokens": tokens,
                         "tokens_per_s": tokens / max(gen, 1e-9), "reward": result.reward,
                         "end": result.info["end_reason"], "steps": result.info["steps"]})
            print(f"seed {seed}: {wall:.1f} s ({wall / scripted_s:.0f}x a scripted episode, {scripted_s * 1000:.0f} ms), "
                  f"{tokens} tokens at {rows[-1]['tokens_per_s']:.1f} tokens/s, {result.info['steps']} steps, "
                  f"reward {result.reward:+.3f}, end: {result.info['end_reason']}", flush=True)
    print(f"\nmodel load {load_s:.1f} s; median episode {statistics.median(r['wall_s'] for r in rows):.1f} s, "
          f"median {statistics.median(r['tokens_per_s'] for r in rows):.1f} tokens/s; "
          f"load average {tuple(round(x, 2) for x in load0)} -> {tuple(round(x, 2) for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
