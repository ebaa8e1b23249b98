"""Byte-level tokenizer (optionally with BPE merges) and chat renderers for the local model.

Token ids: ``0..255`` are raw bytes, ``256..271`` are special tokens (fixed ids, see
``SPECIAL_TOKENS``), merged byte pairs (if any) follow from ``272``. Special tokens are only ever
produced by the renderer, never by ``encode`` (a user who types ``<|end|>`` gets its bytes), so
``decode(encode(s)) == s`` for every string.

>>> tok = Tokenizer()
>>> tok.encode("hi!")
[104, 105, 33]
>>> tok.decode(tok.encode("héllo <|end|>"))
'héllo <|end|>'
>>> tok.vocab_size, tok.end_token_id
(272, 257)

A renderer turns chat messages into tokens plus one weight per token saying which tokens a
supervised step trains on (tinker-cookbook's ``train_on_what``):

>>> r = ChatRenderer(tok)
>>> msgs = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
>>> tokens, weights = r.build_supervised_example(msgs)
>>> r.tokenizer.decode(tokens)
'<|bos|><|user|>2+2?<|end|><|assistant|>4<|end|>'
>>> [r.tokenizer.decode([t]) for t, w in zip(tokens, weights) if w > 0]
['4', '<|end|>']
>>> r.tokenizer.decode(r.build_generation_prompt(msgs[:1]))
'<|bos|><|user|>2+2?<|end|><|assistant|>'
>>> r.parse_response(tok.encode("4") + [tok.end_token_id])
({'role': 'assistant', 'content': '4'}, True)
"""

from __future__ import annotations

import json
import re
from collections import Counter
from enum import StrEnum
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

import numpy as np

SPECIAL_TOKENS: tuple[str, ...] = (
    "<|bos|>",
    "<|end|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|tool|>",
    "<|tool_call|>",
    "<|pad|>",
)
"""Special tokens, at ids ``256 + index``. ``<|end|>`` ends every turn and is the EOS token."""

N_BYTES = 256
N_SPECIAL_SLOTS = 16  # ids 256..271 are reserved for special tokens (8 used, 8 spare)
FIRST_MERGE_ID = N_BYTES + N_SPECIAL_SLOTS

# Pre-tokenization for BPE: merges never cross these chunk boundaries (GPT-2 style, ASCII classes).
_CHUNK = re.compile(r" ?[A-Za-z]+| ?[0-9]{1,3}| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")


class TrainOnWhat(StrEnum):
    """Which tokens a supervised example trains on (names as in tinker-cookbook)."""

    LAST_ASSISTANT_MESSAGE = "last_assistant_message"
    ALL_ASSISTANT_MESSAGES = "all_assistant_messages"
    ALL_MESSAGES = "all_messages"
    ALL_TOKENS = "all_tokens"
    ALL_USER_AND_SYSTEM_MESSAGES = "all_user_and_system_messages"


class Tokenizer:
    """Byte-level tokenizer with fixed special tokens and optional byte-pair merges.

    Args:
        merges: ordered pairs of token ids; merge ``i`` creates id ``272 + i``.

    The API follows the parts of Hugging Face's tokenizers that Tinker code uses
    (``encode``, ``decode``, ``eos_token_id``, ``bos_token_id``, ``vocab_size``).

    >>> tok = Tokenizer.train_bpe(["abab abab abab"], n_merges=2)
    >>> tok.merges
    [(97, 98), (272, 272)]
    >>> tok.encode("abab"), tok.decode(tok.encode("abab"))
    ([273], 'abab')
    """

    name = "rsigym-byte"

    def __init__(self, merges: Sequence[tuple[int, int]] = ()):
        self.merges: list[tuple[int, int]] = [(int(a), int(b)) for a, b in merges]
        self._ranks: dict[tuple[int, int], int] = {pair: i for i, pair in enumerate(self.merges)}
        self._bytes: list[bytes] = [bytes([i]) for i in range(N_BYTES)]
        self._bytes += [s.encode() for s in SPECIAL_TOKENS]
        self._bytes += [f"<|reserved_{i}|>".encode() for i in range(len(SPECIAL_TOKENS), N_SPECIAL_SLOTS)]
        for a, b in self.merges:
            if not (0 <= a < len(self._bytes) and 0 <= b < len(self._bytes)) or a in self.special_ids or b in self.special_ids:
                raise ValueError(f"merge ({a}, {b}) refers to an unknown or special token")
            self._bytes.append(self._bytes[a] + self._bytes[b])
        self._cache: dict[str, list[int]] = {}

    # --- ids of the special tokens -------------------------------------------------------------
    special_ids = frozenset(range(N_BYTES, N_BYTES + N_SPECIAL_SLOTS))

    @staticmethod
    def special(name: str) -> int:
        """Id of a special token, e.g. ``Tokenizer.special("<|end|>") == 257``."""
        return N_BYTES + SPECIAL_TOKENS.index(name)

    bos_token_id = N_BYTES + 0
    end_token_id = N_BYTES + 1
    eos_token_id = end_token_id
    pad_token_id = N_BYTES + 7

    @property
    def vocab_size(self) -> int:
        """Number of token ids (bytes + special slots + merges)."""
        return len(self._bytes)

    # --- encode / decode --------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Text → token ids. Special-token text is encoded as plain bytes; ``add_special_tokens``
        prepends ``<|bos|>`` (Hugging Face's meaning of the flag)."""
        ids = [self.bos_token_id] if add_special_tokens else []
        if not self.merges:
            ids.extend(text.encode("utf-8"))
            return ids
        for chunk in _CHUNK.findall(text):
            cached = self._cache.get(chunk)
            if cached is None:
                cached = self._bpe(list(chunk.encode("utf-8")))
                if len(self._cache) < 100_000:
                    self._cache[chunk] = cached
            ids.extend(cached)
        return ids

    def _bpe(self, ids: list[int]) -> list[int]:
        ranks = self._ranks
        while len(ids) > 1:
            best, best_rank = -1, len(ranks)
            for i in range(len(ids) - 1):
                r = ranks.get((ids[i], ids[i + 1]), best_rank)
                if r < best_rank:
                    best, best_rank = i, r
            if best < 0:
                break
            pair, new = self.merges[best_rank], FIRST_MERGE_ID + best_rank
            out, i = [], 0
            while i < len(ids):
                if i < len(ids) - 1 and ids[i] == pair[0] and ids[i + 1] == pair[1]:
                    out.append(new)
                    i += 2
                else:
                    out.append(ids[i])
                    i += 1
            ids = out
        return ids

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token stands for (special tokens: their text)."""
        return self._bytes[token]

    def decode(self, tokens: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Token ids → text (invalid UTF-8, e.g. from a sampled half character, becomes U+FFFD)."""
        special = self.special_ids
        parts = [self._bytes[int(t)] for t in tokens if not (skip_special_tokens and int(t) in special)]
        return b"".join(parts).decode("utf-8", errors="replace")

    # --- training and persistence -----------------------------------------------------------
    @classmethod
    def train_bpe(cls, texts: Iterable[str], n_merges: int) -> "Tokenizer":
        """Learn ``n_merges`` byte-pair merges from ``texts`` (deterministic: ties → smallest pair)."""
        words = Counter(chunk for text in texts for chunk in _CHUNK.findall(text))
        seqs = [(list(w.encode("utf-8")), n) for w, n in words.items()]
        merges: list[tuple[int, int]] = []
        for m in range(n_merges):
            pairs: Counter[tuple[int, int]] = Counter()
            for ids, n in seqs:
                for pair in zip(ids, ids[1:]):
                    pairs[pair] += n
            if not pairs:
                break
            top = max(pairs.values())
            pair = min(p for p, c in pairs.items() if c == top)
            new = FIRST_MERGE_ID + m
            merges.append(pair)
            for ids, _ in seqs:
                i = 0
                while i < len(ids) - 1:
                    if ids[i] == pair[0] and ids[i + 1] == pair[1]:
                        ids[i : i + 2] = [new]
                    i += 1
        return cls(merges)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.name, "special_tokens": list(SPECIAL_TOKENS), "merges": [list(p) for p in self.merges]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Tokenizer":
        if data.get("type", cls.name) != cls.name:
            raise ValueError(f"not a {cls.name} tokenizer: {data.get('type')!r}")
        return cls([tuple(p) for p in data.get("merges", [])])

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: str | Path) -> "Tokenizer":
        return cls.from_dict(json.loads(Path(path).read_text()))

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, merges={len(self.merges)})"


# --- chat rendering ---------------------------------------------------------------------------

Message = Mapping[str, Any]

_ROLES = ("system", "user", "assistant", "tool")


class MessageError(ValueError):
    """A chat message that cannot be rendered (unknown role, content not a string, ...)."""


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """Check OpenAI-style chat messages and return them as plain dicts.

    >>> validate_messages([{"role": "user", "content": "hi"}])
    [{'role': 'user', 'content': 'hi'}]
    >>> validate_messages([{"role": "robot", "content": "hi"}])
    Traceback (most recent call last):
    ...
    rsigym_env.worlds.common.tokenizer.MessageError: message 0: unknown role 'robot' (system, user, assistant, tool)
    """
    if not isinstance(messages, (list, tuple)) or not messages:
        raise MessageError("messages must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise MessageError(f"message {i}: not an object")
        role = m.get("role")
        if role not in _ROLES:
            raise MessageError(f"message {i}: unknown role {role!r} ({', '.join(_ROLES)})")
        content = m.get("content")
        if content is None:
            content = ""
        if isinstance(content, list):  # OpenAI content parts: keep the text parts
            try:
                content = "".join(p["text"] for p in content if p.get("type") == "text")
            except (TypeError, KeyError, AttributeError):
                raise MessageError(f"message {i}: content parts must be objects with 'type' and 'text'") from None
        if not isinstance(content, str):
            raise MessageError(f"message {i}: content must be a string")
        msg: dict[str, Any] = {"role": role, "content": content}
        calls = m.get("tool_calls")
        if calls:
            if role != "assistant" or not isinstance(calls, list):
                raise MessageError(f"message {i}: tool_calls must be a list on an assistant message")
            msg["tool_calls"] = [_normalize_call(c, i) for c in calls]
        out.append(msg)
    return out


def _normalize_call(call: Any, i: int) -> dict[str, Any]:
    fn = call.get("function", call) if isinstance(call, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise MessageError(f"message {i}: a tool call needs a function name")
    args = fn.get("arguments", "{}")
    if not isinstance(args, str):
        args = json.dumps(args, sort_keys=True)
    out = {"type": "function", "function": {"name": fn["name"], "arguments": args}}
    if isinstance(call, Mapping) and "id" in call:
        out["id"] = call["id"]
    return out


class Renderer(Protocol):
    """What the training loop and the server need from a renderer."""

    tokenizer: Any

    def build_supervised_example(
        self, messages: Sequence[Message], train_on_what: TrainOnWhat | str = ...
    ) -> tuple[np.ndarray, np.ndarray]: ...

    def build_generation_prompt(self, messages: Sequence[Message], tools: Sequence[Mapping] | None = None) -> list[int]: ...

    def get_stop_sequences(self) -> list[int] | list[str]: ...

    def parse_response(self, tokens: Sequence[int]) -> tuple[dict[str, Any], bool]: ...


def _trained(role: str, index: int, last_assistant: int, what: TrainOnWhat) -> bool:
    if what is TrainOnWhat.ALL_TOKENS or what is TrainOnWhat.ALL_MESSAGES:
        return True
    if what is TrainOnWhat.ALL_ASSISTANT_MESSAGES:
        return role == "assistant"
    if what is TrainOnWhat.LAST_ASSISTANT_MESSAGE:
        return index == last_assistant
    return role in ("user", "system")  # ALL_USER_AND_SYSTEM_MESSAGES


def _supervised_example(
    messages: Sequence[Message], train_on_what: TrainOnWhat | str, prefix: list[int],
    render: Callable[[Message], tuple[list[int], list[int]]],
) -> tuple[np.ndarray, np.ndarray]:
    """Shared by the renderers: ``prefix``, then each message's (header, body) from ``render``; headers
    are trained only with ``ALL_TOKENS``, bodies as ``train_on_what`` says."""
    what = TrainOnWhat(train_on_what)
    msgs = validate_messages(messages)
    last = max((i for i, m in enumerate(msgs) if m["role"] == "assistant"), default=-1)
    everything = 1.0 if what is TrainOnWhat.ALL_TOKENS else 0.0
    segments: list[tuple[list[int], float]] = [(prefix, everything)] if prefix else []
    for i, m in enumerate(msgs):
        header, body = render(m)
        segments.append((header, everything))
        segments.append((body, 1.0 if _trained(m["role"], i, last, what) else 0.0))
    return _segments_to_arrays(segments)


def _segments_to_arrays(segments: list[tuple[list[int], float]]) -> tuple[np.ndarray, np.ndarray]:
    tokens = np.fromiter((t for seg, _ in segments for t in seg), dtype=np.int64)
    weights = np.fromiter((w for seg, w in segments for _ in seg), dtype=np.float32)
    return tokens, weights


class ChatRenderer:
    """The local model's chat format, built from special tokens::

        <|bos|><|system|>...<|end|><|user|>...<|end|><|assistant|>...<|tool_call|>{json}<|end|><|tool|>...<|end|>

    A turn's header token is never trained on; its content and closing ``<|end|>`` are when
    ``train_on_what`` selects the message. Tools offered to the model are rendered as a system
    turn listing their JSON schemas. Stop sequence: ``<|end|>``.
    """

    name = "rsigym_chat"

    def __init__(self, tokenizer: Tokenizer | None = None):
        self.tokenizer = tokenizer or Tokenizer()
        t = self.tokenizer
        self._header = {r: t.special(f"<|{r}|>") for r in _ROLES}
        self._call = t.special("<|tool_call|>")

    def _render_message(self, msg: Mapping[str, Any]) -> tuple[int, list[int]]:
        body = self.tokenizer.encode(msg["content"])
        for call in msg.get("tool_calls", ()):
            fn = call["function"]
            body += [self._call] + self.tokenizer.encode(json.dumps({"name": fn["name"], "arguments": fn["arguments"]}))
        return self._header[msg["role"]], body + [self.tokenizer.end_token_id]

    def _tools_message(self, tools: Sequence[Mapping]) -> dict[str, Any]:
        lines = ["You can call these tools:"] + [json.dumps(t.get("function", t), sort_keys=True) for t in tools]
        return {"role": "system", "content": "\n".join(lines)}

    def build_supervised_example(
        self, messages: Sequence[Message], train_on_what: TrainOnWhat | str = TrainOnWhat.ALL_ASSISTANT_MESSAGES
    ) -> tuple[np.ndarray, np.ndarray]:
        """Messages → (tokens int64, weights float32), one weight per token."""

        def render(m: Message) -> tuple[list[int], list[int]]:
            header, body = self._render_message(m)
            return [header], body

        return _supervised_example(messages, train_on_what, [self.tokenizer.bos_token_id], render)

    def build_generation_prompt(self, messages: Sequence[Message], tools: Sequence[Mapping] | None = None) -> list[int]:
        """Messages (+ offered tools) → prompt tokens ending with the assistant header."""
        msgs = validate_messages(messages)
        if tools:
            msgs = [self._tools_message(tools)] + msgs
        out = [self.tokenizer.bos_token_id]
        for m in msgs:
            header, body = self._render_message(m)
            out += [header] + body
        return out + [self._header["assistant"]]

    def get_stop_sequences(self) -> list[int]:
        return [self.tokenizer.end_token_id]

    def parse_response(self, tokens: Sequence[int]) -> tuple[dict[str, Any], bool]:
        """Sampled tokens → (assistant message, ended cleanly with ``<|end|>``).

        Text after ``<|tool_call|>`` that parses as ``{"name", "arguments"}`` JSON becomes an
        OpenAI ``tool_calls`` entry; anything malformed stays in the content.
        """
        tokens = [int(t) for t in tokens]
        end = self.tokenizer.end_token_id
        ok = end in tokens
        if ok:
            tokens = tokens[: tokens.index(end)]
        parts: list[list[int]] = [[]]
        for t in tokens:
            if t == self._call:
                parts.append([])
            else:
                parts[-1].append(t)
        content = self.tokenizer.decode(parts[0], skip_special_tokens=True)
        calls = []
        for j, part in enumerate(parts[1:]):
            text = self.tokenizer.decode(part, skip_special_tokens=True)
            try:
                obj = json.loads(text)
                name, args = obj["name"], obj.get("arguments", "{}")
                if not isinstance(name, str):
                    raise TypeError
            except (ValueError, KeyError, TypeError):
                content += text
                continue
            if not isinstance(args, str):
                args = json.dumps(args, sort_keys=True)
            calls.append({"id": f"call_{j}", "type": "function", "function": {"name": name, "arguments": args}})
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            msg["tool_calls"] = calls
        return msg, ok


class RoleColonRenderer:
    """A plain-text format that works with any tokenizer having ``encode(text, add_special_tokens=False)``
    and ``decode`` (so also with a Hugging Face tokenizer behind the real Tinker)::

        System: ...\\n\\nUser: ...\\n\\nAssistant: ...\\n\\n

    Stop sequence: the string ``"\\n\\nUser:"``.

    >>> r = RoleColonRenderer(Tokenizer())
    >>> toks, w = r.build_supervised_example([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
    >>> r.tokenizer.decode(toks), r.tokenizer.decode([t for t, x in zip(toks, w) if x])
    ('User: hi\\n\\nAssistant: yo\\n\\n', 'yo\\n\\n')
    """

    name = "role_colon"

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def _enc(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def build_supervised_example(
        self, messages: Sequence[Message], train_on_what: TrainOnWhat | str = TrainOnWhat.ALL_ASSISTANT_MESSAGES
    ) -> tuple[np.ndarray, np.ndarray]:
        return _supervised_example(messages, train_on_what, [], lambda m: (
            self._enc(f"{m['role'].capitalize()}: "), self._enc(m["content"] + "\n\n")))

    def build_generation_prompt(self, messages: Sequence[Message], tools: Sequence[Mapping] | None = None) -> list[int]:
        msgs = validate_messages(messages)
        text = "".join(f"{m['role'].capitalize()}: {m['content']}\n\n" for m in msgs)
        return self._enc(text + "Assistant:")

    def get_stop_sequences(self) -> list[str]:
        return ["\n\nUser:"]

    def parse_response(self, tokens: Sequence[int]) -> tuple[dict[str, Any], bool]:
        text = self.tokenizer.decode(list(tokens))
        ok = "\n\nUser:" in text
        text = text.split("\n\nUser:")[0]
        return {"role": "assistant", "content": text.strip()}, ok


RENDERERS = {ChatRenderer.name: ChatRenderer, RoleColonRenderer.name: RoleColonRenderer}


def get_renderer(name: str, tokenizer: Any) -> Renderer:
    """A renderer by name (``rsigym_chat`` or ``role_colon``) over ``tokenizer``."""
    if name not in RENDERERS:
        raise ValueError(f"unknown renderer {name!r}; renderers: {', '.join(sorted(RENDERERS))}")
    return RENDERERS[name](tokenizer)
