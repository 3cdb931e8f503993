"""``--plan`` refuses what the campaign's own settings cannot run (exit 3, a reason per trial), and a
real run refuses the same before any host is touched: here the host is a documentation address no
connection could reach, and the results folder is never made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.cli import EXIT_OK, EXIT_REFUSED, main

REPO = Path(__file__).resolve().parents[3]
GIB = 2**30
# offload-local.yaml's load: 9,921 tokens a request at most.
CAMPAIGN = """\
name: refusals
inventory: ghost.yml
engine:
  kind: stand-in
  model: /tmp/gpu-campaign-models/standin-64m
  port: 18010
  args: {max-model-len: 16384}
  env: {STANDIN_KV_CAPACITY_TOKENS: "60000", STANDIN_OFFLOAD_BYTES_PER_TOKEN: "4096"}
experiments:
  - kind: offload
    modes:
      hbm_only: &m
        workload: {sessions: 8, history_tokens: 8000, concurrency: 4, turns: 4, turn_tokens: 400, output_tokens: 48}
        quality: {conversations: 4, turns: 3, doc_tokens: 1500, max_tokens: 64}
      native_cpu: {<<: *m, offload_gib: 8}
"""
CONTEXT = ("refused: context: the load needs about 9,921 tokens per request (longest prompt, its output and the "
           "chat template), more than max-model-len 1,024")


@pytest.fixture
def campaign(tmp_path: Path) -> Path:
    # 192.0.2.1 (TEST-NET-1) answers nothing: a run that tried to reach it would not end in a second.
    (tmp_path / "ghost.yml").write_text("all:\n  hosts:\n    ghost: {ansible_host: 192.0.2.1, ansible_user: nobody}\n")
    path = tmp_path / "campaign.yaml"
    path.write_text(CAMPAIGN)
    return path


def test_plan_exits_3_with_the_reason_of_each_refused_trial(campaign: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    results = str(tmp_path / "results")
    assert main([str(campaign), "--plan", "--results", results]) == EXIT_OK
    capsys.readouterr()
    assert main([str(campaign), "--plan", "--results", results, "-e", "engine.args.max-model-len=1024"]) == 3
    out = capsys.readouterr().out
    assert out.count(CONTEXT) == 2
    assert out.rstrip().endswith("2 trial(s) in campaign refusals; 2 refused by the campaign's own settings")
    assert main([str(campaign), "--plan", "--json", "--results", results, "-e", "engine.args.max-model-len=1024"]) \
        == EXIT_REFUSED
    assert [t["refusals"] for t in json.loads(capsys.readouterr().out)["trials"]] == [[CONTEXT[9:]]] * 2


def test_a_real_run_refuses_before_any_host_is_touched(campaign: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    assert main([str(campaign), "--quiet", "--results", str(results), "-e", "engine.args.max-model-len=1024"]) \
        == EXIT_REFUSED
    err = capsys.readouterr().err
    assert f"offload.hbm_only.r1@ghost: {CONTEXT}" in err and f"offload.native_cpu.r1@ghost: {CONTEXT}" in err
    assert "nothing was started" in err
    assert not results.exists()  # no lock, no plan.json, no facts: nothing ran


def test_facts_an_earlier_run_cached_refuse_host_ram_the_node_never_has(
        campaign: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    facts = results / "hosts" / "ghost" / "facts.json"
    facts.parent.mkdir(parents=True)
    facts.write_text(json.dumps({"memory": {"total_bytes": 15 * GIB, "available_bytes": 14 * GIB}}))
    assert main([str(campaign), "--quiet", "--results", str(results)]) == EXIT_REFUSED
    err = capsys.readouterr().err
    assert ("offload.native_cpu.r1@ghost: refused: host RAM: 1 engine copy x 8 GiB offload x safety 2 = 16.0 GiB "
            "needed on this host, but only 15.0 GiB is there in all (MemTotal)") in err
    assert "hbm_only" not in err  # no offload tier: nothing to pin
    assert sorted(p.name for p in results.iterdir()) == ["hosts"]  # nothing else was written
    facts.write_text(json.dumps({"memory": {"total_bytes": 64 * GIB, "available_bytes": 1 * GIB}}))
    assert main([str(campaign), "--plan", "--results", str(results)]) == EXIT_OK  # what was free then: the node's


@pytest.mark.parametrize("path", sorted((REPO / "campaigns").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_campaign_passes_its_own_plan(path: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # A fresh results folder: no facts of an earlier run on this machine decide it.
    assert main([str(path), "--plan", "--results", str(tmp_path / "r")]) == EXIT_OK, capsys.readouterr().out
