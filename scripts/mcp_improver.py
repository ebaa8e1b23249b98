#!/usr/bin/env python3
"""A reference MCP improver agent for ``rsigym recurse --improver-command``: adapt it to build your own.

Each round ``rsigym recurse`` runs this once with the round's session in its environment
(``RSIGYM_MCP_URL``, ``RSIGYM_RUN_KEY``). Over the ``mcp`` SDK's client (streamable HTTP, bearer run key)
it plays the outer episode as any agent would, seeing only what an agent sees (dev detail, the
validation score of its submission as one number):

1. read the observation (budget) and the parent program ``code/researcher.py`` from the harness, and
   its ``STRATEGY``, ``RANGES`` and ``ALLELES`` literals;
2. propose a few single-gene edits it has not tried before (a JSON memory file kept across rounds),
   ideas that gained before first;
3. evaluate the parent and each edit on dev (``evaluate`` k=1 + ``wait``), while the budget allows;
4. submit the best (the parent if no edit beats it on dev) and record what each edit gained.

    rsigym recurse --scenario recursive-scripted --rounds 5 --seeds 3 --imp-k 0 \\
        --improver-command "python scripts/mcp_improver.py --memory /tmp/improver-memory.json"

The memory file is ``--memory``, else ``$RSIGYM_IMPROVER_MEMORY``, else ``mcp-improver-memory.json`` in the
working directory (not under ``$RSIGYM_HOME``: ``rsigym recurse`` hides that from an improver command), **one per
chain**: in chain 3 (``$RSIGYM_IMPROVER_CHAIN``, set by ``rsigym recurse``) ``mem.json`` is read and written as
``mem.chain-3.json``, so what one chain learned never steers another (the chains of a run must stay independent
for its between-chain intervals to mean anything). Every MCP call is
bounded (``--call-timeout``, default 50 s, under a client's usual 60 s); a refused call ends the script
with a clear message and exit status 2 (``rsigym recurse`` then stops: the session did not submit).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import contextlib
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any, AsyncIterator

CODE = "code/researcher.py"
OBSERVATION_URI = "rsigym://observation"
STATUS_LINE = re.compile(r"\A\[step [^\n]*\]\n")
MORE = re.compile(r"\n\.\.\. \(\d+ more characters; read with @offset to continue\)\Z")
HARNESS = re.compile(r"\b[Hh]arness (h-[0-9a-f]+)")
STARTED = re.compile(r"started as (job-\d+)")
DEV_SCORE = re.compile(r"dev score (-?\d+(?:\.\d+)?)")
USD = re.compile(r"\$(\d[\d,]*(?:\.\d+)?)")


HTTP_ERRORS: list[str] = []
"""HTTP error statuses the server answered (the SDK reports them only as "an error response")."""


class Refused(RuntimeError):
    """A tool call the server refused (or that did not answer in time): the agent stops."""


# ------------------------------------------------------------------------------------------------ the program


def literal_node(source: str, name: str) -> ast.Dict:
    """The module-level ``NAME = {...}`` dict literal of a researcher program.

    >>> literal_node("A = 1\\nB = {'x': 2}\\n", "B").keys[0].value
    'x'
    """
    for node in ast.parse(source).body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == name and isinstance(node.value, ast.Dict):
            return node.value
    raise ValueError(f"no module-level {name} = {{...}} literal")


def literal(source: str, name: str) -> dict[str, Any]:
    """``literal(source, "STRATEGY")``: the literal's value ({} if the program has none, for RANGES/ALLELES).

    >>> literal("STRATEGY = {'k': 3}", "STRATEGY"), literal("STRATEGY = {}", "RANGES")
    ({'k': 3}, {})
    """
    try:
        return ast.literal_eval(literal_node(source, name))
    except ValueError:
        if name == "STRATEGY":
            raise
        return {}


def set_gene(source: str, name: str, value: Any) -> str:
    """``source`` with ``STRATEGY[name]`` rewritten to ``value`` (only that literal's text changes).

    >>> set_gene("STRATEGY = {'k': 3, 'x': 'a'}  # keep\\n", "k", 4)
    "STRATEGY = {'k': 4, 'x': 'a'}  # keep\\n"
    """
    node = literal_node(source, "STRATEGY")
    for key, old in zip(node.keys, node.values):
        if isinstance(key, ast.Constant) and key.value == name:
            raw = source.encode()  # ast offsets count UTF-8 bytes
            lines = raw.splitlines(keepends=True)
            start = sum(map(len, lines[:old.lineno - 1])) + old.col_offset
            end = sum(map(len, lines[:old.end_lineno - 1])) + old.end_col_offset  # type: ignore[operator]
            return (raw[:start] + repr(value).encode() + raw[end:]).decode()
    raise KeyError(f"STRATEGY has no gene {name!r}")


def moves(gene: str, value: Any, ranges: dict[str, Any], alleles: dict[str, Any]) -> list[Any]:
    """The single-gene values one step from ``value``: up and down within ``RANGES`` (``add``: a tenth of the
    range, whole steps for integers; ``mul``/``dbl``: x2 and /2), or every other allele of ``ALLELES``.

    >>> moves("data_fraction", 0.4, {"data_fraction": [0.05, 0.95, "add"]}, {})
    [0.49, 0.31]
    >>> moves("lora_rank", 128, {"lora_rank": [4, 128, "dbl"]}, {}), moves("r", "a", {}, {"r": ["a", "b"]})
    ([64], ['b'])
    """
    if gene in ranges and isinstance(value, (int, float)) and not isinstance(value, bool):
        lo, hi, kind = ranges[gene]
        integer = all(isinstance(v, int) for v in (lo, hi, value))
        if kind == "add":
            step = max(1, round((hi - lo) / 10)) if integer else (hi - lo) / 10
            out = [value + step, value - step]
        else:
            out = [value * 2, value / 2]
        out = [int(round(v)) if integer else round(v, 4) for v in out]
        return [v for v in out if lo <= v <= hi and v != value]
    if gene in alleles and not isinstance(value, list):
        return [a for a in alleles[gene] if a != value]
    return []


def propose(genes: dict[str, Any], ranges: dict[str, Any], alleles: dict[str, Any], memory: dict[str, Any],
            n: int) -> list[tuple[str, Any]]:
    """Up to ``n`` single-gene edits of ``genes`` not tried before from the same value (``memory["tried"]``),
    one per gene: genes whose edits gained on dev before first (best mean gain first), then genes without a
    record, then genes whose edits lost, each group in the program's order.

    >>> propose({"k": 3, "r": "a"}, {"k": [1, 8, "add"]}, {"r": ["a", "b"]},
    ...         {"tried": [{"gene": "k", "from": 3, "value": 4, "gain": -0.1},
    ...                    {"gene": "r", "from": "a", "value": "c", "gain": 0.2}]}, 2)
    [('r', 'b'), ('k', 2)]
    """
    tried = {(t["gene"], json.dumps(t.get("from")), json.dumps(t["value"])) for t in memory.get("tried", [])}
    gains: dict[str, list[float]] = {}
    for t in memory.get("tried", []):
        if t.get("gain") is not None:
            gains.setdefault(t["gene"], []).append(float(t["gain"]))
    order = {g: i for i, g in enumerate(genes)}

    def rank(gene: str) -> tuple[float, int]:
        past = gains.get(gene)
        return (-(sum(past) / len(past)) if past else 0.0, order[gene])

    out: list[tuple[str, Any]] = []
    for gene in sorted(genes, key=rank):
        for value in moves(gene, genes[gene], ranges, alleles):
            if (gene, json.dumps(genes[gene]), json.dumps(value)) not in tried and len(out) < n:
                out.append((gene, value))
                break  # one edit per gene per round: more genes tried
    return out


def load_memory(path: Path) -> dict[str, Any]:
    """The memory file's content (``{"tried": [...], "rounds": [...]}``), empty if it does not exist yet."""
    if not path.exists():
        return {"tried": [], "rounds": []}
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("tried"), list):
        raise ValueError(f"{path} is not this agent's memory file (no 'tried' list)")
    data.setdefault("rounds", [])
    return data


def save_memory(path: Path, memory: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(memory, indent=1))
    tmp.replace(path)


def default_memory() -> Path:
    """``$RSIGYM_IMPROVER_MEMORY``, else ``mcp-improver-memory.json`` in the working directory (an improver
    command cannot see ``$RSIGYM_HOME``)."""
    return Path(os.environ.get("RSIGYM_IMPROVER_MEMORY") or "mcp-improver-memory.json")


def chain_memory(path: Path, chain: str | None) -> Path:
    """The memory file of ``chain`` (``$RSIGYM_IMPROVER_CHAIN``): one per chain, beside ``path``.

    >>> chain_memory(Path("runs/mem.json"), "3"), chain_memory(Path("mem.json"), None), chain_memory(Path("m"), "0")
    (PosixPath('runs/mem.chain-3.json'), PosixPath('mem.json'), PosixPath('m.chain-0'))
    """
    if not chain:
        return path
    if not re.fullmatch(r"-?[0-9]+", chain):
        raise ValueError(f"RSIGYM_IMPROVER_CHAIN must be a chain number, not {chain!r}")
    return path.with_name(f"{path.stem}.chain-{chain}{path.suffix}")


# ------------------------------------------------------------------------------------------------ MCP


class Session:
    """One MCP session: each tool call bounded by ``call_timeout`` s; a refusal raises :class:`Refused`."""

    def __init__(self, client: Any, call_timeout: float, log: Any = None):
        self.client, self.call_timeout, self.log = client, call_timeout, log or (lambda msg: None)
        self.left_usd: float | None = None  # the run's money left, as the last tool result said

    async def call(self, tool: str, args: dict[str, Any], *, allow: tuple[str, ...] = ()) -> Any:
        try:
            result = await asyncio.wait_for(self.client.call_tool(tool, args), self.call_timeout)
        except asyncio.TimeoutError:
            raise Refused(f"{tool} did not answer within {self.call_timeout:g} s") from None
        if result.is_error and (result.structured_content or {}).get("error") not in allow:
            text = result.content[0].text if result.content else ""
            raise Refused(f"{tool} {json.dumps(args)[:200]} was refused: {text[:500]}")
        left = (result.structured_content or {}).get("budget_left_usd")
        if isinstance(left, (int, float)):
            self.left_usd = float(left)
        return result

    @staticmethod
    def text(result: Any) -> str:
        return result.content[0].text if result.content else ""

    async def observation(self) -> dict[str, Any]:
        try:
            contents = await asyncio.wait_for(self.client.read_resource(OBSERVATION_URI), self.call_timeout)
        except asyncio.TimeoutError:
            raise Refused(f"the observation did not come within {self.call_timeout:g} s") from None
        observation = json.loads(contents.contents[0].text)
        if isinstance(observation.get("budget_left_usd"), (int, float)):
            self.left_usd = float(observation["budget_left_usd"])
        return observation

    async def read_file(self, ref: str, max_pages: int = 50) -> str:
        """A harness file of any length, page by page (``ref@offset``), bounded."""
        parts, page_ref = [], ref
        for _ in range(max_pages):
            text = self.text(await self.call("read", {"ref": page_ref}))
            status = STATUS_LINE.match(text)
            body = text[status.end():] if status else text
            more = MORE.search(body)
            if not more:
                return "".join(parts) + body
            parts.append(body[:more.start()])
            _, _, offset = page_ref.partition("@")
            page_ref = f"{ref}@{int(offset or 0) + more.start()}"
        raise Refused(f"{ref} did not end within {max_pages} pages")


    async def dev_score(self, version: str, max_waits: int = 40) -> float | None:
        """Evaluate harness ``version`` on dev (k=1) and wait for it (bounded): its dev score, or None when the
        evaluation's worst case does not fit the money left (refused as ``insufficient_budget``, at no cost)."""
        started = await self.call("evaluate", {"harness": version, "k": 1}, allow=("insufficient_budget",))
        if started.is_error:
            return None
        job = STARTED.search(self.text(started))
        if job is None:
            raise Refused(f"evaluate {version} did not start a job")
        for _ in range(max_waits):
            await self.call("wait", {"job": job.group(1)}, allow=("unknown_ref",))  # unknown_ref: it already ended
            text = self.text(await self.call("read", {"ref": job.group(1)}))
            score = DEV_SCORE.search(text)
            if score:
                return float(score.group(1))
        raise Refused(f"the evaluation {job.group(1)} of {version} did not end after {max_waits} waits")


@contextlib.asynccontextmanager
async def connect(mcp_url: str, key: str, call_timeout: float) -> AsyncIterator[Any]:
    """The ``mcp`` SDK's client over streamable HTTP with the run key as bearer."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async def note(response: Any) -> None:
        if response.status_code >= 400:
            why = {401: " (the run key was refused)", 403: " (the run key does not allow it)"}.get(response.status_code, "")
            HTTP_ERRORS.append(f"HTTP {response.status_code}{why}")

    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=call_timeout + 10,
                                  event_hooks={"response": [note]}) as http:
        async with Client(streamable_http_client(mcp_url, http_client=http),
                          read_timeout_seconds=call_timeout + 10) as client:
            yield client


# ------------------------------------------------------------------------------------------------ one round


async def improve(session: Session, memory: dict[str, Any], max_edits: int = 3) -> dict[str, Any]:
    """Play one outer episode: read the parent, evaluate it and up to ``max_edits`` untried single-gene edits on
    dev while the budget allows, submit the best; ``memory`` is updated in place. Returns the round's record."""
    log = session.log
    observation = await session.observation()
    log(f"observation: ${observation.get('budget_left_usd', '?')} and {observation.get('time_left_h', '?')} h left, "
        f"{observation.get('running_jobs', '?')} jobs running")
    initial = HARNESS.search(session.text(await session.call("read", {"ref": "harness:latest"})))
    if initial is None:
        raise Refused("read harness:latest named no harness version")
    parent = initial.group(1)
    source = await session.read_file(f"harness:{parent}/{CODE}")
    genes = literal(source, "STRATEGY")
    ranges, alleles = literal(source, "RANGES"), literal(source, "ALLELES")
    ideas = propose(genes, ranges, alleles, memory, max_edits)
    before = session.left_usd
    parent_dev = await session.dev_score(parent)
    after = session.left_usd
    cost = (before - after) if before is not None and after is not None else None
    if parent_dev is None:
        log("the budget does not cover an evaluation of the parent: submitting it as it is")
        ideas = []
    else:
        log(f"parent {parent}: dev {parent_dev:.4f}" + (f" (cost ${cost:,.2f}, ${after:,.2f} left)" if cost else ""))
    scores = {parent: parent_dev if parent_dev is not None else -math.inf}
    edits: dict[str, tuple[str, Any]] = {}
    for gene, value in ideas:
        left = session.left_usd
        if cost is not None and left is not None and left < 1.5 * cost:
            log(f"stopping: ${left:,.2f} left, an evaluation costs about ${cost:,.2f}")
            break
        wrote = await session.call("edit_harness", {"path": CODE, "content": set_gene(source, gene, value),
                                                    "base_version": parent})
        version = wrote.structured_content["result"]["version"]
        score = await session.dev_score(version)
        if score is None:
            log(f"stopping: the budget left (${session.left_usd or 0:,.2f}) does not cover another evaluation")
            break
        edits[version], scores[version] = (gene, value), score
        gain = scores[version] - scores[parent]
        memory["tried"].append({"gene": gene, "value": value, "from": genes[gene], "gain": round(gain, 6)})
        log(f"{gene}: {genes[gene]!r} -> {value!r} ({version}): dev {scores[version]:.4f} ({gain:+.4f})")
    best = max(scores, key=lambda v: (scores[v], v == parent))  # a tie keeps the parent
    done = await session.call("submit", {"checkpoint": "base", "harness": best})
    for _ in range(40):  # submit may run as a job (validation): wait for it, bounded
        if (done.structured_content or {}).get("done"):
            break
        job = STARTED.search(session.text(done))
        if job is None:
            raise Refused(f"submit did not end the episode: {session.text(done)[:300]}")
        done = await session.call("wait", {"job": job.group(1)})
    if not (done.structured_content or {}).get("done"):
        raise Refused("submit did not end the episode within its waits")
    record = {"parent": parent, "submitted": best, "edit": edits.get(best), "dev": parent_dev,
              "best_dev": scores[best] if math.isfinite(scores[best]) else None, "reward": done.structured_content.get("reward")}
    memory["rounds"].append(record)
    log(f"submitted {best} ({'the parent' if best == parent else '%s=%r' % edits[best]}); "
        f"reward {record['reward']}")
    return record


async def run(mcp_url: str, key: str, memory_path: Path, max_edits: int, call_timeout: float) -> dict[str, Any]:
    """Connect, play one round, save the memory (also after a refusal); a refusal is re-raised as itself."""
    memory = load_memory(memory_path)
    refused: Refused | None = None
    record: dict[str, Any] = {}
    try:
        async with connect(mcp_url, key, call_timeout) as client:
            try:
                record = await improve(Session(client, call_timeout,
                                               log=lambda m: print(f"[mcp_improver] {m}", flush=True)), memory, max_edits)
            except Refused as exc:  # raised outside the SDK's task group, not as an exception group
                refused = exc
    finally:
        save_memory(memory_path, memory)  # what was learned survives a refusal
    if refused is not None:
        raise refused
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("RSIGYM_MCP_URL"), help="MCP URL (default $RSIGYM_MCP_URL)")
    parser.add_argument("--key", default=os.environ.get("RSIGYM_RUN_KEY"), help="run key (default $RSIGYM_RUN_KEY)")
    parser.add_argument("--memory", type=Path, default=None, help="the JSON memory file kept across rounds, one per "
                        "chain: X.json is X.chain-N.json in chain N (default $RSIGYM_IMPROVER_MEMORY or "
                        "./mcp-improver-memory.json)")
    parser.add_argument("--max-edits", type=int, default=3, help="single-gene edits evaluated per round (3)")
    parser.add_argument("--call-timeout", type=float, default=50.0, help="seconds any MCP call may take (50)")
    args = parser.parse_args(argv)
    if not args.url or not args.key:
        parser.error("no session: set RSIGYM_MCP_URL and RSIGYM_RUN_KEY (rsigym recurse --improver-command does)")
    if not 0 <= args.max_edits <= 50:
        parser.error("--max-edits must be 0..50")
    if not 0 < args.call_timeout <= 600:
        parser.error("--call-timeout must be in (0, 600] seconds")
    try:
        memory = chain_memory(args.memory or default_memory(), os.environ.get("RSIGYM_IMPROVER_CHAIN"))
        print(f"[mcp_improver] memory {memory} (round {os.environ.get('RSIGYM_IMPROVER_ROUND', '?')})", flush=True)
        asyncio.run(run(args.url, args.key, memory, args.max_edits, args.call_timeout))
    except (Refused, ValueError, KeyError) as exc:
        print(f"mcp_improver: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # the connection or the session failed (unreachable, a key refused): say why, briefly
        why = "; ".join(dict.fromkeys(HTTP_ERRORS + leaves(exc)))
        print(f"mcp_improver: the session at {args.url} failed: {why}", file=sys.stderr)
        return 2
    return 0


def leaves(exc: BaseException) -> list[str]:
    """The messages of an exception and of whatever an exception group holds (the SDK's task groups wrap them).

    >>> leaves(ExceptionGroup("g", [ValueError("a"), ExceptionGroup("h", [KeyError("b")])]))
    ['ValueError: a', "KeyError: 'b'"]
    """
    if isinstance(exc, BaseExceptionGroup):
        return [m for inner in exc.exceptions for m in leaves(inner)]
    return [f"{type(exc).__name__}: {exc}"]


if __name__ == "__main__":
    sys.exit(main())
