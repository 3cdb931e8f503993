"""Answer text for the stand-in, and its fallback tokenizer (regex word pieces).

The stand-in tokenizes with the model folder's ``tokenizer.json`` (``tokenizer.py``) when it can.
When it cannot (no ``tokenizers`` package, no tokenizer file), it falls back to ``RegexTokenizer``
here: it cuts text into word pieces (an optional leading space and up to 8 word characters, one
punctuation mark, or one whitespace character) and maps each piece to a stable id, so the same text
always gives the same ids and a repeated prefix gives the same KV blocks; its counts are not a real
tokenizer's (about one token per word).

The answers are English-looking sentences drawn from a word list by a generator seeded with the
prompt, so the same prompt gets the same answer and different prompts get different ones. The
generator emits *atoms* (a word with its leading space, a comma, a sentence end with an optional
line break) and each atom becomes the token ids the tokenizer gives it alone, one token per step.
Atoms end where every pre-tokenizer in use splits text (a word, a lone punctuation run), so the
streamed answer re-tokenizes to exactly the ids it was generated as, with either tokenizer (a chat
history that quotes it hits the cache like vLLM would).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

__all__ = [
    "ANSWER_WORDS",
    "EOS_CHAT",
    "EOS_TEXT",
    "AnswerGenerator",
    "Atom",
    "RegexTokenizer",
    "StandinTokenizer",
    "answer_atoms",
    "content_text",
    "render_chat",
]

EOS_CHAT = "<|im_end|>"
EOS_TEXT = "<|endoftext|>"
_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

_PIECE_RE = re.compile(r"<\|[a-z_]{1,32}\|>| ?\w{1,8}| ?[^\w\s]|\s")

# Short words only: every generated word must be exactly one regex piece (<= 8 characters).
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
ANSWER_WORDS = tuple(w for w in _WORD_TEXT.split() if len(w) <= 8)
_PUNCTUATION = (",", ".", "?", ".\n", "?\n")

# (token id, its text) for each token of one atom, in order.
Atom = tuple[tuple[int, str], ...]


def _stable_id(piece: str, base: int, span: int) -> int:
    digest = hashlib.blake2b(piece.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return base + int.from_bytes(digest, "little") % span


def answer_atoms(words: Iterable[str] = ANSWER_WORDS) -> list[str]:
    """Every atom the answer generator can emit with these words."""
    out: list[str] = []
    for word in words:
        out += [" " + word, word.capitalize(), " " + word.capitalize()]
    return [*out, *_PUNCTUATION]


class StandinTokenizer(Protocol):
    """What the server and the engine need of a tokenizer (the model's, or the regex fallback)."""

    kind: str  # "tokenizers" (the model's tokenizer.json) or "regex" (the fallback)
    vocab_size: int  # prompt token ids must be in [0, vocab_size)
    eos_chat: int
    eos_text: int
    answer_words: tuple[str, ...]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def encode_many(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...

    def token_strs(self, token_ids: Sequence[int]) -> list[str]: ...

    def render_chat(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                    extra: Mapping[str, Any] | None = None) -> str: ...

    def atom(self, text: str) -> Atom: ...


class RegexTokenizer:
    """Fallback word-piece tokenizer with stable ids; specials and the answer vocabulary have fixed ids."""

    kind = "regex"
    answer_words = ANSWER_WORDS

    def __init__(self, vocab_size: int = 151_936) -> None:
        fixed: list[str] = list(_SPECIALS)
        for word in ANSWER_WORDS:
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
        self._atoms: dict[str, Atom] = {}
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

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self._ids
        out: list[int] = []
        append = out.append
        for piece in _PIECE_RE.findall(text):
            known = ids.get(piece)
            append(known if known is not None else self.piece_id(piece))
        return out

    def encode_many(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, token_ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        pieces = self._pieces
        if skip_special_tokens:
            return "".join(pieces.get(t, "") for t in token_ids if t >= len(_SPECIALS))
        return "".join(pieces.get(t, "") for t in token_ids)

    def piece_of(self, token_id: int) -> str:
        return self._pieces.get(token_id, "")

    def token_strs(self, token_ids: Sequence[int]) -> list[str]:
        return [self._pieces.get(t, "") for t in token_ids]

    def render_chat(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                    extra: Mapping[str, Any] | None = None) -> str:
        return render_chat(messages, add_generation_prompt)

    def atom(self, text: str) -> Atom:
        found = self._atoms.get(text)
        if found is None:
            found = tuple((self.piece_id(p), p) for p in _PIECE_RE.findall(text))
            self._atoms[text] = found
        return found


def content_text(content: Any) -> str | None:
    """A message's content as vLLM gives it to a string-content chat template (text parts joined by \\n)."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return str(content)


def render_chat(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
    """ChatML, which is additive: turn t's prompt plus its answer is a prefix of turn t+1's prompt."""
    out = [f"<|im_start|>{m.get('role', 'user')}\n{content_text(m.get('content')) or ''}<|im_end|>\n"
           for m in messages]
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)


class AnswerGenerator:
    """Yields the answer's tokens one at a time; the sequence depends only on the prompt and seed."""

    def __init__(self, tokenizer: StandinTokenizer, prompt_ids: Sequence[int], seed: int | None,
                 base_seed: int) -> None:
        self.atom = tokenizer.atom
        self.words = tokenizer.answer_words
        # Tuples of ints hash the same in every process (no PYTHONHASHSEED salt for ints).
        # hash(None) is per-process on Python 3.11, so None becomes -1 first.
        key = hash((base_seed, -1 if seed is None else seed, len(prompt_ids), tuple(prompt_ids)))
        self.rng = random.Random(key)
        self._sentence_left = 0
        self._started = False
        self._comma = False
        self._pending: list[tuple[int, str]] = []  # the rest of a multi-token atom, last token first

    def natural_length(self, low: int, high: int) -> int:
        return self.rng.randint(max(1, low), max(1, low, high))

    def next_piece(self) -> tuple[int, str]:
        """The next token: (id, its text)."""
        if self._pending:
            return self._pending.pop()
        atom = self.atom(self.next_atom())
        if len(atom) > 1:
            self._pending = list(reversed(atom[1:]))
        return atom[0]

    def next_atom(self) -> str:
        """The next atom of text. Punctuation never touches punctuation (",," or ",." would be one
        pre-token for byte-level BPE tokenizers, and could merge into a token of its own)."""
        rng = self.rng
        if self._sentence_left <= 0:
            self._sentence_left = rng.randint(5, 16) - 1
            word = rng.choice(self.words).capitalize()
            text = " " + word if self._started else word
            self._started = True
            self._comma = False
            return text
        self._sentence_left -= 1
        if self._sentence_left == 0:
            end = "." if rng.random() < 0.85 else "?"
            if rng.random() < 0.15:
                self._started = False  # a paragraph break: the next sentence starts a line
                return end + "\n"
            return end
        if not self._comma and self._sentence_left > 1 and rng.random() < 0.08:
            self._comma = True
            return ","
        self._comma = False
        return " " + rng.choice(self.words)
