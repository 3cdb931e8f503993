"""The quality check: multi-turn arithmetic over one shared long document, and a loop detector.

Offload paths have been reported to change a model's output (a user saw a model "looping '!'
after a couple of turns" with an offload connector), so an offload mode's speed is only worth
reporting next to a check that its answers are still right. The document is an inventory report:
depots holding counts of goods, buried in filler paragraphs. Each conversation asks a sum of two
depots, then adds or subtracts another depot turn after turn, with the model's own earlier answers
in its history; an answer is correct when its ``ANSWER: <n>`` (or, failing that, its last number)
equals the true running total. Every answer also goes through ``detect_loop``.

All conversations start with the same document, so after the first one it is served from the
prefix cache or an offload tier: the path under test. Against the engine stand-in (whose answers
are generated text, not a model's) the check still runs, to rehearse it, but its summary says
``applicable: false`` and it must be reported as not applicable, never as passed.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import aiohttp

from nodetools.loadgen.client import Conversation, get_json, stream_chat
from nodetools.loadgen.sizing import ServerTokenizer
from nodetools.loadgen.text import TextSource
from nodetools.loadgen.workload import QualitySpec

__all__ = ["QualityCheck", "QualitySpec", "detect_loop", "extract_answer"]

_ITEMS = ("copper wire", "oak barrels", "glass jars", "steel bolts", "wool bales", "paper reams", "tea chests",
          "salt sacks", "brass valves", "cotton rolls", "tin plates", "rope coils")
_SYLLABLES = ("ka", "lor", "mi", "den", "sar", "tu", "vel", "os", "rin", "ga", "pol", "ne", "ash", "bri", "cu")
_ANSWER = re.compile(r"ANSWER:\s*\**\s*(-?\d[\d,]*)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d[\d,]*")
# Loops, as seen in broken offload runs: one symbol over and over ('!!!!!!!!'), a short unit
# repeated back to back ('the the the ...', 'abcabcabc...'), or the same line again and again.
_SYMBOL_RUN = re.compile(r"([^\w\s\-=_*#.])\1{7,}")
_ANY_RUN = re.compile(r"(\S)\1{31,}")
_UNIT_RUN = re.compile(r"(.{2,40}?)\1{4,}", re.DOTALL)


def extract_answer(text: str) -> int | None:
    """The number after the last ``ANSWER:``, else the last number in the text, else None."""
    found = _ANSWER.findall(text) or _NUMBER.findall(text)
    if not found:
        return None
    try:
        return int(found[-1].replace(",", ""))
    except ValueError:
        return None


def detect_loop(text: str) -> str | None:
    """Why ``text`` looks like a generation loop, or None."""
    if m := _SYMBOL_RUN.search(text):
        return f"symbol {m.group(1)!r} repeated {len(m.group(0))} times"
    if m := _ANY_RUN.search(text):
        return f"character {m.group(1)!r} repeated {len(m.group(0))} times"
    for m in _UNIT_RUN.finditer(text):
        unit = m.group(1)
        if unit.strip() and len(m.group(0)) >= 24 and not unit.strip().isdigit():
            return f"{unit!r} repeated {len(m.group(0)) // len(unit)} times in a row"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for i in range(len(lines) - 3):
        if lines[i] == lines[i + 1] == lines[i + 2] == lines[i + 3]:
            return f"line {lines[i][:40]!r} repeated 4+ times"
    return None


@dataclass(frozen=True)
class _Depot:
    name: str
    item: str
    count: int


def _ledger(rng: random.Random, n: int) -> list[_Depot]:
    names: set[str] = set()
    while len(names) < n:
        names.add("".join(rng.choices(_SYLLABLES, k=3)).capitalize())
    ordered = sorted(names)  # a set's order depends on PYTHONHASHSEED: sort, then shuffle with the spec.seed RNG
    rng.shuffle(ordered)
    return [_Depot(name, rng.choice(_ITEMS), rng.randint(12, 987)) for name in ordered]


def _questions(rng: random.Random, depots: list[_Depot], turns: int) -> Iterator[tuple[str, int]]:
    """(question, the true running total after it) for one conversation."""
    picked = rng.sample(depots, min(len(depots), turns + 1))
    a, b = picked[0], picked[1]
    total = a.count + b.count
    yield (f"Using only the inventory report, how many crates do depot {a.name} and depot {b.name} hold "
           "together? Show the sum, then end with a last line of the form 'ANSWER: <number>'.", total)
    for turn, depot in enumerate(picked[2:turns + 1], start=1):
        if turn % 2:
            total += depot.count
            yield (f"Now add the crates held by depot {depot.name} to your previous total. End with "
                   "'ANSWER: <number>'.", total)
        else:
            total -= depot.count
            yield (f"Now subtract the crates held by depot {depot.name} from your previous total. End with "
                   "'ANSWER: <number>'.", total)


class QualityCheck:
    def __init__(self, spec: QualitySpec, url: str, model: str, out: Path, engine_kind: str = "") -> None:
        self.spec = spec
        self.base = url.rstrip("/")
        self.model = model
        self.out = out
        self.engine_kind = engine_kind
        self.rng = random.Random(f"quality:{spec.seed}")
        self.depots = _ledger(self.rng, max(2 * spec.conversations + spec.turns + 2, 24))
        self._fh: IO[str] | None = None
        self.counts = {"answered": 0, "correct": 0, "looping": 0, "failed_requests": 0}

    async def _document(self, tok: ServerTokenizer) -> tuple[str, int]:
        lines = [f"Depot {d.name} holds {d.count} crates of {d.item}." for d in self.depots]
        head, tail = "Inventory report. Each depot line below states how many crates that depot holds.", \
            "End of the inventory report."
        filler = TextSource(f"quality-doc:{self.spec.seed}")
        # Names and numbers take more tokens per character than prose: count the fixed lines and a
        # filler sample apart, and fill what the lines leave of the budget.
        sample = filler.text(2000)
        filler_per_char = await tok.count_text(sample) / max(1, len(sample))
        fixed = await tok.count_text("\n\n".join([head, *lines, tail]))
        room = max(0, int((self.spec.doc_tokens - fixed) / max(filler_per_char, 1e-3)))
        per_line = room // (len(lines) + 1)
        parts = [head]
        for line in lines:
            parts.extend((filler.text(per_line)[:per_line].rsplit(" ", 1)[0], line))
        parts.append(tail)
        doc = "\n\n".join(p for p in parts if p)
        return doc, await tok.count_text(doc)

    async def _engine_label(self, http: aiohttp.ClientSession) -> str:
        if self.engine_kind:
            return self.engine_kind
        try:
            version = await get_json(http, f"{self.base}/version", timeout_s=10)
        except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError):
            return "unknown"
        return str(version.get("engine") or "vllm") if isinstance(version, dict) else "unknown"

    def _write(self, record: dict[str, Any]) -> None:
        assert self._fh is not None
        self._fh.write(json.dumps(record, separators=(",", ":")) + "\n")

    async def _conversation(self, http: aiohttp.ClientSession, index: int, doc: str) -> None:
        conv = Conversation()
        rng = random.Random(f"quality:{self.spec.seed}:{index}")
        for turn, (question, expected) in enumerate(_questions(rng, self.depots, self.spec.turns)):
            conv.append("user", f"{doc}\n\n{question}" if turn == 0 else question)
            body = conv.body(self.model, self.spec.max_tokens, temperature=0.0)
            result = await stream_chat(http, f"{self.base}/v1/chat/completions", body, self.spec.request_timeout_s)
            record: dict[str, Any] = {"conversation": index, "turn": turn, "question": question,
                                      "expected": expected, "status": "ok" if result.ok else "failed",
                                      "error": result.error, "ttft_s": result.ttft_s,
                                      "completion_tokens": result.completion_tokens,
                                      "finish_reason": result.finish_reason, "text_tail": result.text[-240:]}
            if not result.ok:
                self.counts["failed_requests"] += 1
                self._write(record)
                return  # the rest of this conversation would build on a missing answer
            answer = extract_answer(result.text)
            looping = detect_loop(result.text)
            record.update(answer=answer, correct=answer == expected, looping=looping)
            self.counts["answered"] += 1
            self.counts["correct"] += int(answer == expected)
            self.counts["looping"] += int(looping is not None)
            self._write(record)
            conv.append("assistant", result.text)

    async def run(self) -> dict[str, Any]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as http:
            engine = await self._engine_label(http)
            tok = ServerTokenizer(http, self.base, self.model)
            doc, doc_tokens = await self._document(tok)
            limit = asyncio.Semaphore(self.spec.concurrency)

            async def one(i: int) -> None:
                async with limit:
                    await self._conversation(http, i, doc)

            self.out.parent.mkdir(parents=True, exist_ok=True)
            with self.out.open("w", buffering=1) as fh:
                self._fh = fh
                await asyncio.gather(*(one(i) for i in range(self.spec.conversations)))
        applicable = engine != "stand-in"
        return {
            "spec": asdict(self.spec), "engine": engine, "applicable": applicable,
            "why_not": None if applicable else "engine=stand-in: its answers are generated text, not a model's",
            "doc_tokens": doc_tokens, "total": self.spec.conversations * self.spec.turns, **self.counts,
        }
