"""``python -m runner report`` on a large campaign: its wall time and peak memory.

Generates a results folder of N startup trials (default 10,000, the most one run may plan: 4
modes x 250 repeats x 10 hosts), each as the runner leaves it: ``trial.json`` with its metrics, and
``raw/<host>/`` with a real vLLM 0.24.0 server log of the H200 (one per mode, hard-linked) and the
timer's ``timings.json`` for it, and the stamp of the code that collected its metrics
(``collected_with``), as a run of this tree leaves it: the report then reads the stored metrics. With
``--recollect`` the stamp is left out (metrics collected by another version of the code), so the
report collects every trial again from its files. Then times ``python -m runner report`` in a
fresh process and reads its peak resident memory. Targets: 20 s and 500 MiB for 10,000 trials.
Its figures, with the load average they were measured at, are kept in docs/campaign.md ("A
campaign's fixed cost").

    .venv/bin/python benchmarks/bench_report.py [--trials 10000] [--recollect] [--keep DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from runner.experiments.base import TrialContext  # noqa: E402
from runner.experiments.startup import KIND  # noqa: E402
from runner.parse.vllm_log import parse_log_file  # noqa: E402
from runner.plan import expand  # noqa: E402
from runner.provenance import collect_stamp  # noqa: E402
from runner.spec import load_campaign  # noqa: E402
from tests.unit.runner.test_startup_timeline import REAL, timings_for  # noqa: E402

TARGET_S, TARGET_MIB = 20.0, 500
HOSTS = 10
LOGS = {"first_start": REAL / "vllm-0.24.0-h200-first_start.log",
        "disk_cold": REAL / "vllm-0.24.0-h200-disk_cold_cache_warm.log",
        "enforce_eager": REAL / "vllm-0.24.0-h200-enforce_eager.log",
        "page_cache_warm": REAL / "vllm-0.24.0-h200-disk_cold_cache_warm.log"}


def _campaign(work: Path, trials: int) -> Path:
    repeats = max(1, -(-trials // (len(LOGS) * HOSTS)))
    inventory = work / "hosts.yml"
    hosts = "".join(f"    h{i:02d}: {{ansible_connection: local}}\n" for i in range(HOSTS))
    inventory.write_text(f"all:\n  hosts:\n{hosts}")
    path = work / "campaign.yaml"
    path.write_text(f"""\
name: report-bench
inventory: {inventory}
engine: {{kind: vllm, model: /models/qwen3-0.6b, gpus: [0], args: {{max-model-len: 8192}}}}
experiments:
  - kind: startup
    modes: [{', '.join(LOGS)}]
    repeats: {repeats}
""")
    return path


def _mode_files(work: Path) -> dict[str, tuple[Path, Path, dict[str, Any]]]:
    """Per mode: its server.log, timings.json and the metrics the runner stored from them."""
    out = {}
    for mode, log in LOGS.items():
        raw = work / "sources" / mode / "raw" / "h"
        raw.mkdir(parents=True)
        shutil.copy(log, raw / "server.log")
        _, timings = timings_for(parse_log_file(log))
        (raw / "timings.json").write_text(json.dumps(timings))
        metrics = KIND.collect(TrialContext(mode, {}, {}, raw.parent.parent, "h"))
        out[mode] = (raw / "server.log", raw / "timings.json", metrics)
    return out


def generate(root: Path, trials: int, stamp: str | None) -> int:
    work = root.parent / f"{root.name}-inputs"
    work.mkdir(parents=True)
    plan = expand(load_campaign(_campaign(work, trials)))
    chosen = plan.trials[:trials]
    files = _mode_files(work)
    (root / "trials").mkdir(parents=True)
    plan_dict = plan.as_dict()
    plan_dict["trials"], plan_dict["trial_count"] = plan_dict["trials"][:trials], len(chosen)
    (root / "plan.json").write_text(json.dumps(plan_dict))
    now = time.time()
    for trial in chosen:
        folder = root / "trials" / trial.id
        raw = folder / "raw" / trial.host
        raw.mkdir(parents=True)
        log, timings, metrics = files[trial.mode]
        os.link(log, raw / "server.log")
        os.link(timings, raw / "timings.json")
        record = {**trial.as_dict(), "status": "ok", "reason": "", "phases": [], "metrics": metrics,
                  "engine_label": "vllm", "host_facts": None, "started": now, "ended": now + 60,
                  "duration_s": 60.0, **({"collected_with": stamp} if stamp else {})}
        (folder / "trial.json").write_text(json.dumps(record))
    shutil.rmtree(work)
    return len(chosen)


def measure(root: Path) -> dict[str, float]:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    before, cpu_before = usage.ru_maxrss, usage.ru_utime + usage.ru_stime
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "runner", "report", str(root)], cwd=REPO, capture_output=True,
                          text=True, check=False)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"report failed (rc={done.returncode}):\n{done.stderr[-3000:]}")
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak_kib = usage.ru_maxrss  # the largest child so far: the report
    if peak_kib <= before:
        raise SystemExit("could not read the report's peak memory (an earlier child was larger)")
    # CPU seconds too: on a shared machine the wall time depends on what else runs.
    return {"wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime - cpu_before, 2),
            "peak_rss_mib": round(peak_kib / 1024, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--keep", type=Path, help="generate the results folder here and keep it")
    parser.add_argument("--recollect", action="store_true",
                        help="trials collected by another version of the code: the report collects each again")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp) / "results"
        started = time.monotonic()
        count = generate(root, args.trials, None if args.recollect else collect_stamp())
        made_s = time.monotonic() - started
        result = {"trials": count, "generated_s": round(made_s, 1), **measure(root),
                  "load_average": round(os.getloadavg()[0], 2), "target_s": TARGET_S, "target_mib": TARGET_MIB}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{count} startup trials (generated in {made_s:.1f} s); load average {result['load_average']}")
    print(f"report: {result['wall_s']:.1f} s (target <= {TARGET_S:g} s; {result['cpu_s']:.1f} s of CPU), peak RSS "
          f"{result['peak_rss_mib']:.0f} MiB (target <= {TARGET_MIB} MiB)")


if __name__ == "__main__":
    main()
