"""The quality check: answers extracted and checked, loops detected, the stand-in reported as n/a."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from nodetools.loadgen.quality import (
    QualityCheck,
    QualitySpec,
    _Depot,
    _ledger,
    _questions,
    detect_loop,
    extract_answer,
)
from nodetools.loadgen.workload import QUESTION_TOKENS
from nodetools.model_maker import PRESETS, write_tokenizer
from tests.nodetools.conftest import Start


@pytest.mark.parametrize("text", [
    "Hello!!!!!!!!!!!!",
    "The total is 12. " + "!" * 40,
    "the the the the the the the the",
    "I think I think I think I think I think I think",
    "Answer.\nSame line\nSame line\nSame line\nSame line",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
])
def test_loops_are_detected(text: str) -> None:
    assert detect_loop(text) is not None


@pytest.mark.parametrize("text", [
    "Depot Kalor holds 342 crates and depot Mi holds 17, so 342 + 17 = 359.\nANSWER: 359",
    "| depot | crates |\n|---|---|\n| A | 1 |\n----------\nANSWER: 1",
    "Total: 1,000,000 crates... ANSWER: 1000000",
    "Wow! That is a lot. Really!",
])
def test_ordinary_answers_are_not_loops(text: str) -> None:
    assert detect_loop(text) is None


def test_answers_are_read_from_the_answer_line_else_the_last_number() -> None:
    assert extract_answer("342 + 17 = 359\nANSWER: 359") == 359
    assert extract_answer("ANSWER: **1,204**") == 1204
    assert extract_answer("first 12 then 40") == 40
    assert extract_answer("ANSWER: -31") == -31
    assert extract_answer("no number here") is None


def test_questions_carry_the_true_running_total() -> None:
    depots = [_Depot(f"D{i}", "tea chests", 100 * (i + 1)) for i in range(6)]
    rng = random.Random(0)
    asked = list(_questions(rng, depots, 4))
    assert len(asked) == 4
    picked = [int(q.split("depot D")[1].split()[0]) for q, _ in asked[1:]]
    first = asked[0][0]
    a, b = (int(part.split()[0]) for part in first.split("depot D")[1:3])
    expected = depots[a].count + depots[b].count
    assert asked[0][1] == expected
    for turn, (index, (question, total)) in enumerate(zip(picked, asked[1:], strict=True), start=1):
        expected += depots[index].count if turn % 2 else -depots[index].count
        assert ("add" in question) == (turn % 2 == 1)
        assert total == expected


def test_against_the_stand_in_it_runs_but_is_not_applicable(standin: Start, tmp_path: Path) -> None:
    server = standin("--max-model-len", "4096")
    out = tmp_path / "quality.jsonl"
    spec = QualitySpec(conversations=3, turns=2, doc_tokens=800, max_tokens=24)
    summary = asyncio.run(QualityCheck(spec, server.url, "m", out).run())
    assert summary["applicable"] is False and summary["engine"] == "stand-in"
    assert summary["why_not"].startswith("engine=stand-in")
    assert summary["total"] == 6 and summary["answered"] == 6 and summary["failed_requests"] == 0
    assert 750 < summary["doc_tokens"] < 900
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["conversation"], r["turn"]) for r in recs) == [(c, t) for c in range(3) for t in range(2)]
    assert all("expected" in r and "correct" in r and "looping" in r for r in recs)


def test_every_question_fits_the_budget_the_preflight_counts(tmp_path: Path) -> None:
    """QUESTION_TOKENS, measured: the longest question and its chat-template markers (and those of
    its answer) with the rehearsal tokenizer that needs the most tokens per character."""
    tiny = PRESETS["qwen3-tiny"]
    write_tokenizer(tmp_path, tiny.vocab_size, tiny.max_position_embeddings)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    markers = len(tok.encode("<|im_start|>user\n<|im_end|>\n").ids)
    longest = 0
    for seed in range(10):
        spec = QualitySpec(seed=seed)
        depots = _ledger(random.Random(f"quality:{seed}"), max(2 * spec.conversations + spec.turns + 2, 24))
        for index in range(spec.conversations * 2):
            for question, _ in _questions(random.Random(f"quality:{seed}:{index}"), depots, spec.turns):
                longest = max(longest, len(tok.encode(question).ids))
    assert longest > 60  # the measurement is of real questions, not of nothing
    assert longest + 2 * markers <= QUESTION_TOKENS
