"""Deterministic tokenizer, chat template and answer text for the stand-in.

The tokenizer cuts text into word pieces (an optional leading space and up to 8 word
characters, one punctuation mark, or one whitespace character) and maps each piece to a stable
id, so the same text always gives the same ids and a repeated prefix gives the same KV blocks.
Concatenating the pieces gives the text back exactly. The answers are English-looking sentences
drawn from a word list by a generator seeded with the prompt, so the same prompt gets the same
answer and different prompts get different ones, and the answer re-tokenizes to the ids it was
generated as (a chat history that quotes it hits the cache like vLLM would).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "EOS_CHAT",
    "EOS_TEXT",
    "AnswerGenerator",
    "Tokenizer",
    "render_chat",
]

EOS_CHAT = "<|im_end|>"
EOS_TEXT = "<|endoftext|>"
_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

_PIECE_RE = re.compile(r"<\|[a-z_]{1,32}\|>| ?\w{1,8}| ?[^\w\s]|\s")

# Short words only: every generated piece must be exactly one tokenizer piece (<= 8 characters).
_WORD_TEXT = (
    "the of and to in is that it for was on are as with his they at be this from have or by one had "
    "not but what all were when we there can an your which their said if do will each about how up "
    "out them then she many some so these would other into has more her two like him see time could "
    "no make than first been its who now people my made over did down only way find use may water "
    "long little very after words called just where most know get through back much before go good "
    "new write our used me man too any day same right look think also around another came come work "
    "three word must because does part even place well such here take why things help put years "
    "different away again off went old number great tell men say small every found still between name "
    "should home big give air line set own under read last never us left end along while might next "
    "sound below saw something thought both few those always looked show large often together asked "
    "house world going want school important until form food keep children feet land side without boy "
    "once animals life enough took sometimes four head above kind began almost live page got earth "
    "need far hand high year mother light parts country father let night following picture being "
    "study second eyes soon times story boys since white days ever paper hard near sentence better "
    "best across during today others however sure means knew try told young miles sun ways thing "
    "whole hear example heard several change answer room sea against top turned learn point city play "
    "toward five using himself usually model engine cache block token memory server request disk "
    "graph kernel "
)
_WORDS = tuple(w for w in _WORD_TEXT.split() if len(w) <= 8)


def _stable_id(piece: str, base: int, span: int) -> int:
    digest = hashlib.blake2b(piece.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return base + int.from_bytes(digest, "little") % span


class Tokenizer:
    """Word-piece tokenizer with stable ids; specials and the answer vocabulary have fixed ids."""

    def __init__(self, vocab_size: int = 151_936) -> None:
        fixed: list[str] = list(_SPECIALS)
        for word in _WORDS:
            for variant in (word, word.capitalize()):
                fixed.extend((variant, " " + variant))
        fixed.extend([".", ",", "\n", " ", "?", ";", ":"])
        self._fixed: dict[str, int] = {}
        for piece in fixed:
            self._fixed.setdefault(piece, len(self._fixed))
        if vocab_size <= len(self._fixed) * 2:
            raise ValueError(f"vocab_size must exceed {len(self._fixed) * 2}")
        self.vocab_size = vocab_size
        self._base = len(self._fixed)
        self._span = vocab_size - self._base
        self._ids: dict[str, int] = dict(self._fixed)
        self._pieces: dict[int, str] = {i: p for p, i in self._fixed.items()}
        self.eos_chat = self._fixed[EOS_CHAT]
        self.eos_text = self._fixed[EOS_TEXT]

    def piece_id(self, piece: str) -> int:
        known = self._ids.get(piece)
        if known is not None:
            return known
        new_id = _stable_id(piece, self._base, self._span)
        # Bound the memo: a long campaign must not grow memory without limit.
        if len(self._ids) < 2_000_000:
            self._ids[piece] = new_id
            self._pieces.setdefault(new_id, piece)
        return new_id

    def encode(self, text: str) -> list[int]:
        ids = self._ids
        out: list[int] = []
        append = out.append
        for piece in _PIECE_RE.findall(text):
            known = ids.get(piece)
            append(known if known is not None else self.piece_id(piece))
        return out

    def decode(self, token_ids: Iterable[int]) -> str:
        return "".join(self._pieces.get(t, "") for t in token_ids)

    def piece_of(self, token_id: int) -> str:
        return self._pieces.get(token_id, "")


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    return str(content)


def render_chat(messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> str:
    """ChatML, which is additive: turn t's prompt plus its answer is a prefix of turn t+1's prompt."""
    out = [f"<|im_start|>{m.get('role', 'user')}\n{_content_text(m.get('content'))}<|im_end|>\n"
           for m in messages]
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)


class AnswerGenerator:
    """Yields the answer's pieces one at a time; the sequence depends only on the prompt and seed."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int], seed: int | None,
                 base_seed: int) -> None:
        self.tokenizer = tokenizer
        # Tuples of ints hash the same in every process (no PYTHONHASHSEED salt for ints).
        # hash(None) is per-process on Python 3.11, so None becomes -1 first.
        key = hash((base_seed, -1 if seed is None else seed, len(prompt_ids), tuple(prompt_ids)))
        self.rng = random.Random(key)
        self._sentence_left = 0
        self._started = False

    def natural_length(self, low: int, high: int) -> int:
        return self.rng.randint(max(1, low), max(1, low, high))

    def next_piece(self) -> tuple[int, str]:
        rng = self.rng
        if self._sentence_left <= 0:
            if self._started and rng.random() < 0.15:
                self._sentence_left = 0
                self._started = False  # a paragraph break, then a new sentence
                return self.tokenizer.piece_id("\n"), "\n"
            self._sentence_left = rng.randint(5, 16)
            word = rng.choice(_WORDS).capitalize()
            piece = (" " if self._started else "") + word
            self._started = True
            self._sentence_left -= 1
            return self.tokenizer.piece_id(piece), piece
        self._sentence_left -= 1
        if self._sentence_left == 0:
            piece = "." if rng.random() < 0.85 else "?"
        elif rng.random() < 0.08:
            piece = ","
        else:
            piece = " " + rng.choice(_WORDS)
        return self.tokenizer.piece_id(piece), piece
