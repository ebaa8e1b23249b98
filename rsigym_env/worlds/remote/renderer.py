"""A renderer over a Hugging Face tokenizer's own chat template (what Tinker's OpenAI endpoint serves with).

Training on the model's own template keeps train and inference formats equal. Weights: 1 on the tokens
each trained assistant message adds (by the prefix property: rendering the first ``i`` messages plus a
generation prompt is a prefix of rendering ``i + 1``); a template without that property is refused
rather than trained on wrongly.

>>> class Tok:  # a stand-in tokenizer: one token per character, a role-tag template
...     def apply_chat_template(self, messages, tokenize=True, add_generation_prompt=False):
...         text = "".join(f"<{m['role']}>{m['content']}</>" for m in messages) + ("<assistant>" if add_generation_prompt else "")
...         return [ord(c) for c in text]
>>> r = HFChatTemplateRenderer(Tok())
>>> toks, w = r.build_supervised_example([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
>>> "".join(chr(t) for t, x in zip(toks, w) if x)
'yo</>'
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..common.tokenizer import TrainOnWhat, validate_messages
from ..common.training import DatasetError


def _ids(value: Any) -> list[int]:
    if isinstance(value, dict) or hasattr(value, "input_ids"):
        value = value["input_ids"]
    return [int(t) for t in value]


class HFChatTemplateRenderer:
    """``build_supervised_example(messages, train_on_what)`` → (tokens, weights) with ``tokenizer.apply_chat_template``."""

    name = "hf_chat_template"

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def _render(self, messages: Sequence[dict[str, Any]], generation_prompt: bool) -> list[int]:
        return _ids(self.tokenizer.apply_chat_template(list(messages), tokenize=True,
                                                       add_generation_prompt=generation_prompt))

    def build_supervised_example(self, messages: Sequence[Any], train_on_what: TrainOnWhat | str =
                                 TrainOnWhat.ALL_ASSISTANT_MESSAGES) -> tuple[np.ndarray, np.ndarray]:
        msgs = [{"role": m["role"], "content": m["content"]} for m in validate_messages(messages)]
        what = TrainOnWhat(train_on_what)
        full = self._render(msgs, False)
        weights = np.zeros(len(full), np.float32)
        assistants = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
        trained = assistants[-1:] if what == TrainOnWhat.LAST_ASSISTANT_MESSAGE else assistants
        if what == TrainOnWhat.ALL_USER_AND_SYSTEM_MESSAGES:
            raise DatasetError(f"train_on_what={what.value!r} is not supported by the hf_chat_template renderer")
        if what in (TrainOnWhat.ALL_TOKENS, TrainOnWhat.ALL_MESSAGES):
            weights[:] = 1.0
            trained = []
        for i in trained:
            start = len(self._render(msgs[:i], True))
            end_tokens = self._render(msgs[:i + 1], False)
            if full[:len(end_tokens)] != end_tokens or end_tokens[:start] != self._render(msgs[:i], True):
                raise DatasetError("the model's chat template does not render conversations incrementally (a "
                                   "prefix changes when a message is added); use renderer 'role_colon'")
            weights[start:len(end_tokens)] = 1.0
        return np.asarray(full, np.int64), weights


def remote_renderer(name: str, tokenizer: Any) -> Any:
    """``hf_chat_template`` or one of the local renderers (``role_colon``) over ``tokenizer``."""
    if name == HFChatTemplateRenderer.name:
        return HFChatTemplateRenderer(tokenizer)
    from ..common.tokenizer import get_renderer

    return get_renderer(name, tokenizer)


__all__ = ["HFChatTemplateRenderer", "remote_renderer"]
