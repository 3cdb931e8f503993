"""The parser's hot regexes use possessive repeats (no places kept to go back to): they match exactly
what the plain backtracking forms, kept here as the reference, match, on lines built piece by piece
with pieces that are right or nearly right (where giving bytes back could change a match)."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from runner.parse import vllm_log

SETTINGS = settings(max_examples=400, deadline=None, derandomize=True)

PREFIX_REFERENCE = re.compile(
    r"(?:\((?P<proc>[A-Za-z_][^()]*)\)[ \t]*)*"
    r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)[ \t]+"
    r"(?P<ts>\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?)[ \t]+"
    r"(?:\[?[\w.<>/-]+:\d+\][ \t]*)?"
)
_NUM = r"(\d+(?:\.\d+)?)"
STATS_REFERENCE = re.compile(
    rf"(?:Engine (\d+):[ \t]*)?Avg prompt throughput: {_NUM} tokens/s, Avg generation throughput: {_NUM} "
    r"tokens/s, Running: (\d+) reqs, Waiting: (\d+) reqs(?:, Deferred: (\d+) reqs)?, "
    rf"GPU KV cache usage: {_NUM}%, Prefix cache hit rate: {_NUM}%(?:, External prefix cache hit rate: {_NUM}%)?"
)

def _joined(*parts: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.tuples(*parts).map("".join)


_SPACE = st.sampled_from(["", " ", "\t", " \t ", "  "])
_PROCS = st.lists(
    _joined(st.sampled_from(["(APIServer pid=1)", "(EngineCore pid=7)", "(", "(x", "()", "(a(b)", "(_ x)"]), _SPACE),
    max_size=3,
).map("".join)
# A vLLM prefix, piece by piece, each piece right or nearly right (where a backtracking match could differ).
PREFIXES = _joined(
    _PROCS,
    st.sampled_from(["INFO", "WARN", "WARNING", "ERROR", "DEBUG", "CRITICAL", "INF", "warn", ""]),
    _SPACE,
    st.sampled_from(["11-29 14:43:27", "11-29 14:43:27.250", "11-29 14:43:27,5", "11-29 14:43:2", "11-29 14:43:27.",
                     "1-29 14:43:27", "11-29 14:43:27.25.5"]),
    _SPACE,
    st.sampled_from(["", "[core.py:123]", "core.py:123]", "[core.py:123", "[core.py:]", "[a:b:1]", "[<x>/y-z.py:1]",
                     "[core.py:12a]", "[é.py:1]", "[core.py:1]]"]),
    _SPACE,
    st.sampled_from(["", "x", "Loading weights took 1.0 s", ":", "]"]),
)  # fmt: skip

_NUMBER = st.sampled_from(["1", "2.5", "0.0", "1.", ".5", "12a", "", "1.2.3", "007"])
# A stats line, field by field, with numbers and separators right or nearly right.
STATS = _joined(
    st.sampled_from(["", "Engine 000: ", "Engine 000:", "Engine 000:\t ", "Engine x: ", "Engine : "]),
    st.just("Avg prompt throughput: "), _NUMBER, st.just(" tokens/s, Avg generation throughput: "), _NUMBER,
    st.just(" tokens/s, Running: "), _NUMBER, st.just(" reqs, Waiting: "), _NUMBER, st.just(" reqs"),
    st.sampled_from(["", ", Deferred: 3 reqs", ", Deferred: 3.5 reqs", ", Deferred:  reqs"]),
    st.just(", GPU KV cache usage: "), _NUMBER, st.just("%, Prefix cache hit rate: "), _NUMBER, st.just("%"),
    st.sampled_from(["", ", External prefix cache hit rate: 7.0%", ", External prefix cache hit rate: 7.%",
                     ", MM cache hit rate: 1%"]),
)  # fmt: skip


def _same(fast: re.Pattern[str], reference: re.Pattern[str], text: str, pos: int = 0) -> None:
    got, expected = fast.match(text, pos), reference.match(text, pos)
    assert (got and (got.span(), got.groups())) == (expected and (expected.span(), expected.groups())), text


@SETTINGS
@given(text=PREFIXES, before=st.sampled_from(["", "2026-11-29 14:43:27,123 "]))
def test_the_line_prefix_matches_as_the_backtracking_form_does(text: str, before: str) -> None:
    _same(vllm_log._PREFIX, PREFIX_REFERENCE, before + text, len(before))


@SETTINGS
@given(text=STATS)
def test_the_stats_line_matches_as_the_backtracking_form_does(text: str) -> None:
    _same(vllm_log._RE_STATS_V1, STATS_REFERENCE, text)


def test_the_pieces_reach_real_lines() -> None:
    """The generated text is not all misses: real prefixes and stats lines are among what is drawn."""
    line = "(APIServer pid=1) (EngineCore pid=7) WARNING 11-29 14:43:27,250 [core.py:123] x"
    _same(vllm_log._PREFIX, PREFIX_REFERENCE, line)
    assert vllm_log._PREFIX.match(line).group("proc") == "EngineCore pid=7"  # type: ignore[union-attr]
    stats = ("Engine 000: Avg prompt throughput: 2.5 tokens/s, Avg generation throughput: 1 tokens/s, Running: 1 "
             "reqs, Waiting: 1 reqs, Deferred: 1 reqs, GPU KV cache usage: 0.0%, Prefix cache hit rate: 2.5%")
    _same(vllm_log._RE_STATS_V1, STATS_REFERENCE, stats)
    assert vllm_log._RE_STATS_V1.match(stats) is not None
