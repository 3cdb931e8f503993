"""The model's tokenizer for the stand-in: ``tokenizer.json`` through the ``tokenizers`` library.

Clients that count tokens with the model's tokenizer (GuideLLM, AIPerf, the campaign's load
generator) must see the counts vLLM would report, so the stand-in tokenizes as vLLM does with a
fast tokenizer:

- ``/v1/completions`` and ``/tokenize`` with a prompt: ``encode(prompt, add_special_tokens=True)``
  (exact: the same ``tokenizer.json``, the same library);
- ``/v1/chat/completions`` and ``/tokenize`` with messages: the chat template of
  ``tokenizer_config.json`` (or ``chat_template.jinja``) rendered with jinja2 the way transformers
  renders it (sandboxed, ``trim_blocks``, ``lstrip_blocks``, ``raise_exception``, ``tojson``, the
  special tokens as variables, the request's ``chat_template_kwargs``), then
  ``encode(text, add_special_tokens=False)``. List contents become their text parts joined by
  ``\\n`` (vLLM's string content format). Without a template or jinja2 it renders ChatML, an
  approximation that it reports;
- generated tokens are real ids: each answer atom (``textgen.py``) is encoded alone and its tokens are
  streamed one per chunk, with the text vLLM's incremental detokenizer would give them. At load time
  a sample of answers is re-tokenized; a tokenizer whose pre-tokenizer would merge atoms is reported.

A model folder that has no ``tokenizer.json`` and was made by the stand-in's ``make-model`` (its
``config.json`` says ``model_type: standin``) gets one, trained by the model maker, as
``make-model`` now writes. Otherwise, or when ``tokenizers`` cannot be imported, the stand-in falls
back to the regex word pieces of ``textgen.RegexTokenizer`` and says so in its log, ``/v1/models``,
``/version`` and ``/metrics``: counts are then not a real tokenizer's.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from nodetools.standin.textgen import (
    ANSWER_WORDS,
    EOS_CHAT,
    EOS_TEXT,
    AnswerGenerator,
    Atom,
    RegexTokenizer,
    StandinTokenizer,
    content_text,
    render_chat,
)

__all__ = [
    "DEFAULT_TOKENIZER_VOCAB",
    "TOKENIZER_FILES",
    "HfTokenizer",
    "TokenizerChoice",
    "TokenizerInfo",
    "check_answers",
    "load_tokenizer",
    "make_tokenizer_files",
]

DEFAULT_TOKENIZER_VOCAB = 8192  # the rehearsal presets' vocabulary (model_maker): ~1.3 tokens per English word
TOKENIZER_FILES = ("special_tokens_map.json", "tokenizer_config.json", "tokenizer.json")  # tokenizer.json last


@dataclass(frozen=True)
class TokenizerInfo:
    """What the stand-in tokenizes with; reported in its log, /v1/models, /version and /metrics."""

    kind: str  # "tokenizers" or "regex"
    source: str  # the tokenizer.json, or why the regex fallback is used
    vocab_size: int
    chat_template: str  # "jinja (FILE)" or "ChatML approximation (why)"
    answers_round_trip: bool  # whether generated answers re-tokenize to their own ids
    library: str | None = None  # "tokenizers X.Y.Z"
    notes: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["notes"] = list(self.notes)
        return out

    def summary(self) -> str:
        if self.kind == "regex":
            return (f"regex word pieces (NOT the model's tokenizer: token counts differ from a real "
                    f"tokenizer's; {self.source})")
        trip = "re-tokenize exactly" if self.answers_round_trip else "do NOT always re-tokenize to their ids"
        return (f"{self.source} ({self.library}, vocab {self.vocab_size}); chat template: {self.chat_template}; "
                f"generated answers {trip}")


@dataclass
class TokenizerChoice:
    tokenizer: StandinTokenizer
    info: TokenizerInfo
    # (level, message) lines for the startup log: the load runs in a thread, the log is written after.
    log: list[tuple[str, str]] = field(default_factory=list)


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _template_source(folder: Path, tok_cfg: dict[str, Any]) -> tuple[str | None, str]:
    """The chat template's text and where it came from (transformers' places, newest first)."""
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        with contextlib.suppress(OSError):
            return jinja_file.read_text(), jinja_file.name
    template = tok_cfg.get("chat_template")
    if template is None:
        template = _read_json(folder / "chat_template.json").get("chat_template")
        where = "chat_template.json"
    else:
        where = "tokenizer_config.json"
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return (template, where) if isinstance(template, str) and template else (None, "")


class _JinjaTemplate:
    """A chat template compiled once, rendered as transformers renders it."""

    def __init__(self, source: str, special: dict[str, str]) -> None:
        import jinja2.ext  # noqa: PLC0415 - jinja2 is optional on the node: without it chat prompts are ChatML
        import jinja2.sandbox  # noqa: PLC0415 - the same

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
                   separators: Any = None, sort_keys: bool = False) -> str:
            return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                           extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._template = env.from_string(source)
        self._special = special

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
               extra: Mapping[str, Any] | None) -> str:
        kwargs: dict[str, Any] = {**self._special, "tools": None, "documents": None}
        if extra:
            kwargs.update(extra)
        kwargs.update(messages=messages, add_generation_prompt=add_generation_prompt)
        return self._template.render(**kwargs)


class HfTokenizer:
    """The model folder's tokenizer.json, used as vLLM uses a fast tokenizer."""

    kind = "tokenizers"

    def __init__(self, folder: Path) -> None:
        # Batch calls run on the calling thread, not on a rayon pool whose spinning workers would take CPU
        # from the event loop (and from a load generator on the same machine) after every request.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        from tokenizers import Tokenizer  # noqa: PLC0415 - optional: without it the stand-in counts regex pieces

        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        # transformers calls the fast tokenizer without padding or truncation unless asked to.
        tok.no_padding()
        tok.no_truncation()
        self._tok = tok
        self._encode = tok.encode
        self._encode_fast = getattr(tok, "encode_batch_fast", None)  # tokenizers >= 0.21
        self._decode = tok.decode
        vocab = tok.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values()) + 1 if vocab else 0
        tok_cfg = _read_json(folder / "tokenizer_config.json")
        special = {name: text for name in ("bos_token", "eos_token", "unk_token", "pad_token")
                   if (text := _token_text(tok_cfg.get(name))) is not None}
        eos_names = [special.get("eos_token"), EOS_CHAT, EOS_TEXT, "</s>"]
        eos_ids = [vocab[n] for n in eos_names if n in vocab]
        self.eos_chat = eos_ids[0] if eos_ids else 0
        self.eos_text = vocab.get(EOS_TEXT, self.eos_chat)
        self.template_note = ""
        self._template: _JinjaTemplate | None = None
        source, where = _template_source(folder, tok_cfg)
        if source is None:
            self.template_note = "ChatML approximation (the model folder has no chat template)"
        else:
            try:
                self._template = _JinjaTemplate(source, special)
                self.template_note = f"jinja ({where})"
            except ImportError:
                self.template_note = "ChatML approximation (jinja2 is not importable)"
            except Exception as exc:  # noqa: BLE001  (any template error: report it, serve ChatML)
                self.template_note = f"ChatML approximation (the template of {where} does not compile: {exc})"
        self._atoms: dict[str, Atom] = {}
        words = []
        for word in ANSWER_WORDS:
            forms = [self._make_atom(t) for t in (" " + word, word.capitalize(), " " + word.capitalize())]
            if all(forms):
                words.append(word)
        self.answer_words = tuple(words) or ANSWER_WORDS
        for text in (",", ".", "?", ".\n", "?\n"):
            self._make_atom(text)

    def _make_atom(self, text: str) -> Atom | None:
        """The atom's ids and per-token texts (what an incremental detokenizer streams), if it decodes back."""
        ids = self._encode(text, add_special_tokens=False).ids
        pieces: list[tuple[int, str]] = []
        shown = ""
        for i, token in enumerate(ids):
            now = self._decode(ids[: i + 1], skip_special_tokens=True)
            if not now.startswith(shown):
                return None
            pieces.append((token, now[len(shown):]))
            shown = now
        if not ids or shown != text:
            return None
        atom = tuple(pieces)
        self._atoms[text] = atom
        return atom

    def atom(self, text: str) -> Atom:
        found = self._atoms.get(text)
        if found is None:  # a text no atom check accepted: stream it as it encodes anyway
            ids = self._encode(text, add_special_tokens=False).ids
            found = tuple((t, self._decode([t], skip_special_tokens=True)) for t in ids) or ((self.eos_text, ""),)
            self._atoms[text] = found
        return found

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._encode(text, add_special_tokens=add_special_tokens).ids

    def encode_many(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        """For a worker thread: the batch call releases the GIL (and skips offsets, when it can)."""
        batch = self._encode_fast or self._tok.encode_batch
        return [e.ids for e in batch(list(texts), add_special_tokens=add_special_tokens)]

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def token_strs(self, token_ids: Sequence[int]) -> list[str]:
        id_to_token = self._tok.id_to_token
        return [id_to_token(t) or "" for t in token_ids]

    def render_chat(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                    extra: Mapping[str, Any] | None = None) -> str:
        """The prompt text vLLM renders for these messages; ValueError when the template refuses them."""
        if self._template is None:
            return render_chat(messages, add_generation_prompt)
        plain = [{**m, "content": content_text(m.get("content"))} for m in messages]
        try:
            return self._template.render(plain, add_generation_prompt, extra)
        except Exception as exc:  # jinja raises many kinds; vLLM answers 400
            raise ValueError(f"the chat template failed: {exc}") from exc


def check_answers(tok: StandinTokenizer, samples: int = 8, atoms: int = 250) -> str | None:
    """Re-tokenize sample answers; None when each gives back its own ids, else the first difference."""
    for seed in range(samples):
        gen = AnswerGenerator(tok, [seed], seed=seed, base_seed=0)
        texts = [gen.next_atom() for _ in range(atoms)]
        ids = [t for text in texts for t, _ in tok.atom(text)]
        text = "".join(piece for atom in texts for _, piece in tok.atom(atom))
        again = tok.encode(text, add_special_tokens=False)
        if again != ids:
            at = next((k for k, (a, b) in enumerate(zip(again, ids, strict=False)) if a != b),
                      min(len(again), len(ids)))
            near = tok.decode(ids[max(0, at - 3):at + 3])
            return (f"sample {seed}: {len(ids)} generated tokens re-tokenize to {len(again)}, first difference "
                    f"at token {at}, near {near!r}")
    return None


def make_tokenizer_files(folder: Path, vocab_size: int = DEFAULT_TOKENIZER_VOCAB,
                         max_position_embeddings: int = 32768) -> int:
    """Write the model maker's trained tokenizer into ``folder`` (atomically per file); returns its vocab size.

    ImportError when ``tokenizers`` (or numpy, which the model maker uses) is missing.
    """
    # The trainer needs numpy, which the stand-in's runtime does not: imported only to make the files.
    from nodetools.model_tokenizer import write_tokenizer  # noqa: PLC0415

    tmp = folder / f".standin-tokenizer-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        size = write_tokenizer(tmp, vocab_size, max_position_embeddings)
        for name in TOKENIZER_FILES:  # tokenizer.json last: its presence means the set is complete
            (tmp / name).replace(folder / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return size


def _regex(vocab_size: int, why: str, log: list[tuple[str, str]]) -> TokenizerChoice:
    info = TokenizerInfo(kind="regex", source=why, vocab_size=vocab_size,
                         chat_template="ChatML (the regex fallback's)", answers_round_trip=True)
    log.append(("warning", f"[stand-in] tokenizer: {info.summary()}"))
    return TokenizerChoice(RegexTokenizer(vocab_size), info, log)


def _is_standin_folder(model: Path) -> bool:
    return _read_json(model / "config.json").get("model_type") == "standin"


def load_tokenizer(model: Path, mode: str = "auto", regex_vocab_size: int = 151_936) -> TokenizerChoice:
    """The tokenizer to serve ``model`` with; never raises for a missing or broken tokenizer."""
    log: list[tuple[str, str]] = []
    if mode == "regex":
        return _regex(regex_vocab_size, "forced by --standin-tokenizer regex", log)
    try:
        import tokenizers  # noqa: PLC0415 - optional: without it the stand-in counts regex word pieces
    except ImportError as exc:
        return _regex(regex_vocab_size, f"the Python package tokenizers is not importable: {exc}", log)
    if not model.is_dir():
        return _regex(regex_vocab_size, f"MODEL {model} is not a folder, so it has no tokenizer.json", log)
    path = model / "tokenizer.json"
    if not path.is_file() and _is_standin_folder(model):
        start = time.monotonic()
        max_pos = _read_json(model / "config.json").get("max_position_embeddings")
        try:
            size = make_tokenizer_files(model, max_position_embeddings=max_pos if isinstance(max_pos, int)
                                        else 32768)
        except (OSError, ImportError, ValueError) as exc:
            return _regex(regex_vocab_size, f"{path} is missing and could not be made: {exc}", log)
        log.append(("info", f"[stand-in] {model} (made by make-model) had no tokenizer.json: trained one "
                            f"(byte-level BPE, vocab {size}) in {time.monotonic() - start:.2f} s, as make-model "
                            "now does"))
    if not path.is_file():
        return _regex(regex_vocab_size, f"{path} does not exist", log)
    try:
        tok = HfTokenizer(model)
        problem = check_answers(tok)
    except Exception as exc:  # noqa: BLE001  (tokenizers raises its own Exception type on a bad file)
        return _regex(regex_vocab_size, f"{path} could not be loaded: {exc}", log)
    notes = []
    if tok.template_note.startswith("ChatML"):
        notes.append(f"chat prompts are rendered as {tok.template_note}: their token counts may differ from vLLM's")
    if len(tok.answer_words) < len(ANSWER_WORDS):
        notes.append(f"{len(ANSWER_WORDS) - len(tok.answer_words)} answer words do not decode back and are "
                     "not generated")
    if problem:
        notes.append(f"generated answers do not always re-tokenize to their own ids: {problem}")
    info = TokenizerInfo(kind="tokenizers", source=str(path), vocab_size=tok.vocab_size,
                         chat_template=tok.template_note, answers_round_trip=problem is None,
                         library=f"tokenizers {tokenizers.__version__}", notes=tuple(notes))
    log.append(("info", f"[stand-in] tokenizer: {info.summary()}"))
    log += [("warning", f"[stand-in] tokenizer: {note}") for note in notes]
    return TokenizerChoice(tok, info, log)
