"""The local model's tokenizer as a Hugging Face tokenizer directory, for the unchanged ``tinker`` SDK.

``tinker.TrainingClient.get_tokenizer()`` loads ``AutoTokenizer.from_pretrained(tokenizer_id)`` with the
``tokenizer_id`` the server reports; the Tinker counterpart reports a directory written here, so the SDK
loads, offline, a tokenizer giving the same ids as the local byte-level BPE
(:class:`~rsigym_env.worlds.common.tokenizer.Tokenizer`), and with the local chat format
(:class:`~rsigym_env.worlds.common.tokenizer.ChatRenderer`) as its chat template, as a model on Tinker comes
with its own.

One difference, by design of Hugging Face tokenizers: text spelling a special token (``<|end|>``) becomes that
token here, while the local tokenizer encodes it as plain bytes.

>>> import tempfile
>>> from transformers import AutoTokenizer
>>> from rsigym_env.worlds.common.tokenizer import ChatRenderer, Tokenizer
>>> local = Tokenizer.train_bpe(["the cat sat on the mat"] * 3, n_merges=8)
>>> hf = AutoTokenizer.from_pretrained(write_hf_tokenizer(local, tempfile.mkdtemp()))
>>> hf.encode("the cat, 123!", add_special_tokens=False) == local.encode("the cat, 123!")
True
>>> msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
>>> list(hf.apply_chat_template(msgs, tokenize=True)["input_ids"]) == list(ChatRenderer(local).build_supervised_example(msgs)[0])
True
"""

from __future__ import annotations

from pathlib import Path

from ..worlds.common.tokenizer import _CHUNK, FIRST_MERGE_ID, N_BYTES, Tokenizer

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
"""The local chat format (``ChatRenderer`` without tools): ``<|bos|><|user|>…<|end|><|assistant|>…<|end|>``."""


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → printable character map (what ``tokenizers``' ByteLevel pre-tokenizer uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def write_hf_tokenizer(tokenizer: Tokenizer, directory: str | Path) -> Path:
    """Write ``tokenizer`` as a Hugging Face tokenizer (``tokenizer.json`` + config with the chat template)."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer
    from transformers import PreTrainedTokenizerFast

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    byte_char = _bytes_to_unicode()
    strings = [byte_char[b] for b in range(N_BYTES)]
    specials = [tokenizer.token_bytes(i).decode() for i in range(N_BYTES, FIRST_MERGE_ID)]
    strings += specials
    for a, b in tokenizer.merges:
        strings.append(strings[a] + strings[b])
    vocab = {s: i for i, s in enumerate(strings)}
    merges = [(strings[a], strings[b]) for a, b in tokenizer.merges]
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_CHUNK.pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    fast = PreTrainedTokenizerFast(tokenizer_object=hf, bos_token="<|bos|>", eos_token="<|end|>",
                                   pad_token="<|pad|>", clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(directory))
    return directory


__all__ = ["CHAT_TEMPLATE", "write_hf_tokenizer"]
