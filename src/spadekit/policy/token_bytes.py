"""The bytes of one token, for the ``bytes`` field of OpenAI logprob entries.

Decoding a single token of a byte-level tokenizer (GPT-2, SmolLM2, Qwen, Llama 3, spadekit's
``tiny``) gives U+FFFD whenever the token holds part of a multi-byte UTF-8 character (``😀`` is
two tokens in SmolLM2): ``decode([id]).encode()`` then yields ``239, 191, 189`` instead of the
token's own bytes. OpenAI's ``bytes`` field exists to let clients rebuild such characters, so
``token_bytes`` reads them from the token itself:

- byte-level BPE (the tokenizer's decoder is ``ByteLevel``): each character of the token string is
  one byte under GPT-2's printable-byte alphabet (built here by ``byte_alphabet``);
- SentencePiece byte fallback: ``<0xAB>`` is the byte 0xAB, and ``▁`` a space;
- special and added tokens, and every other tokenizer: the UTF-8 of the decoded token.

``TokenBytes(tokenizer)`` caches the decision about the tokenizer and the bytes of each token.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@lru_cache(maxsize=1)
def byte_alphabet() -> dict[str, int]:
    """GPT-2's map from the printable stand-in character of each byte back to the byte: bytes
    that are printable Latin-1 (``!``..``~``, ``¡``..``¬``, ``®``..``ÿ``) stand for themselves;
    the other 68 get the code points 256, 257, ... in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {chr(b): b for b in keep}
    extra = 0
    for b in range(256):
        if b not in table.values():
            table[chr(256 + extra)] = b
            extra += 1
    return table


def _decoder_types(tokenizer: Any) -> set[str]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return set()
    try:
        decoder = json.loads(backend.to_str()).get("decoder") or {}
    except (ValueError, AttributeError):
        return set()
    kinds = {decoder.get("type")}
    for sub in decoder.get("decoders") or []:  # a Sequence decoder
        if isinstance(sub, dict):
            kinds.add(sub.get("type"))
    return {k for k in kinds if isinstance(k, str)}


class TokenBytes:
    """``self(token_id) -> bytes`` for one tokenizer (module docstring)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.byte_level = "ByteLevel" in _decoder_types(tokenizer)
        self.special = {int(i) for i in getattr(tokenizer, "all_special_ids", []) or []}
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        self.special |= {int(i) for i in added}
        self._cache: dict[int, bytes] = {}

    def __call__(self, token_id: int) -> bytes:
        tid = int(token_id)
        hit = self._cache.get(tid)
        if hit is None:
            hit = self._cache[tid] = self._bytes(tid)
        return hit

    def _bytes(self, tid: int) -> bytes:
        tok = self.tokenizer
        if tid not in self.special:
            piece = tok.convert_ids_to_tokens(tid)
            if isinstance(piece, str) and piece:
                if self.byte_level:
                    table = byte_alphabet()
                    if all(c in table for c in piece):
                        return bytes(table[c] for c in piece)
                m = _BYTE_FALLBACK.match(piece)
                if m:
                    return bytes([int(m.group(1), 16)])
                if "\u2581" in piece and not self.byte_level:  # SentencePiece's space
                    return piece.replace("\u2581", " ").encode("utf-8")
        return tok.decode([tid], skip_special_tokens=False).encode("utf-8")
