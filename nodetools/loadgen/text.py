"""Deterministic, English-like text for chat sessions: seeded, varied, sized later in tokens.

Benchmarks that send ``"hi hi hi ..."`` (one repeated token) exercise neither a real tokenizer nor
realistic attention; this module writes sentences from a few hundred common words drawn with a
Zipf-like weighting, per-session proper names, numbers, dates and punctuation. The same seed
always gives the same text, and different seeds give texts that share no long prefix (so two
sessions never hit each other's prefix cache by accident).
"""

from __future__ import annotations

import itertools
import random

__all__ = ["TextSource"]

_WORD_TEXT = """
the of and to a in is that for it as was with be by on not he this are or his from at which
but have an they you were her she there one all we their has been would more if will so no
what about when who up out them some could into than then its only other time new these two
may first any like now my such our over man even most made after also did many before must
through back years where much your way well down should because each just those people how too
little state good very make world still own see men work long get here between both life being
under never day same another know while last might us great old year off come since against go
came right used take three himself few house use during without again place around however home
small found thought went say part once general high upon school every does got united left
number course war until always away something fact though water less public put think almost
hand enough far took head yet government system better set told nothing night end why called
didn find going look asked later knew point next program city business give group toward young
days let room president side social given present several order national possible rather second
face per among form important often things looked early white case john become large big need
four within felt along children saw best church ever least power development light thought
family interest want members others mind country area done open god service problem certain
kind different thing whole sense wanted economic information public report reason results
report engine cache memory token request server model budget schedule shipment invoice ledger
account balance review meeting quarter estimate forecast contract supplier warehouse delivery
customer question answer summary decision policy record sample measure figure table
"""
_COMMON = tuple(dict.fromkeys(_WORD_TEXT.split()))  # deduplicated, most common first
_NAME_PARTS = ("ar", "bel", "cor", "dan", "el", "fen", "gar", "hal", "is", "jor", "kel", "lin", "mar", "nor",
               "os", "pel", "quin", "ros", "sal", "tor", "ul", "van", "wes", "yor", "zan", "bri", "cla", "dre")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")
_CONNECTORS = ("However,", "Meanwhile,", "In short,", "As a result,", "For example,", "Still,", "Later,",
               "On the other hand,", "In practice,", "By then,")
# Zipf-like weights: the k-th word is drawn with weight 1/(k+8), so "the" is common but not dominant.
_CUM_WEIGHTS = list(itertools.accumulate(1.0 / (k + 8) for k in range(len(_COMMON))))


class TextSource:
    """Seeded text: ``paragraph()`` and ``text(chars)`` return the same strings for the same seed."""

    def __init__(self, seed: int | str) -> None:
        self.rng = random.Random(f"loadgen-text:{seed}")
        # Per-source proper names: they make sessions' vocabularies differ, as real chats do.
        self.names = [self._name() for _ in range(12)]

    def _name(self) -> str:
        parts = self.rng.choices(_NAME_PARTS, k=self.rng.randint(2, 3))
        return "".join(parts).capitalize()

    def _number(self) -> str:
        r = self.rng.random()
        if r < 0.3:
            return str(self.rng.randint(2, 99))
        if r < 0.55:
            return f"{self.rng.randint(100, 99_999):,}"
        if r < 0.75:
            return f"{self.rng.uniform(0, 100):.1f}%"
        if r < 0.9:
            return f"{self.rng.randint(1, 28)} {self.rng.choice(_MONTHS)} {self.rng.randint(1990, 2030)}"
        return f"${self.rng.uniform(1, 5000):.2f}"

    def sentence(self) -> str:
        rng = self.rng
        words = rng.choices(_COMMON, cum_weights=_CUM_WEIGHTS, k=rng.randint(6, 24))
        for _ in range(rng.randint(0, 2)):
            words[rng.randrange(len(words))] = rng.choice(self.names)
        if rng.random() < 0.45:
            words.insert(rng.randrange(1, len(words) + 1), self._number())
        if len(words) > 10 and rng.random() < 0.5:
            words[rng.randrange(3, len(words) - 2)] += ","
        first = words[0]
        words[0] = first[:1].upper() + first[1:]
        if rng.random() < 0.12:
            words.insert(0, rng.choice(_CONNECTORS))
        end = "." if rng.random() < 0.85 else rng.choice(("?", "!", ";"))
        return " ".join(words) + end

    def paragraph(self) -> str:
        return " ".join(self.sentence() for _ in range(self.rng.randint(3, 7)))

    def text(self, chars: int) -> str:
        """About ``chars`` characters of paragraphs (never cut inside a word)."""
        out: list[str] = []
        size = 0
        while size < chars:
            para = self.paragraph()
            out.append(para)
            size += len(para) + 2
        return "\n\n".join(out)

