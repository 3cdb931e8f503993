"""The kinds registry imports a kind's module when the kind is first used (runner/experiments): a
campaign's start pays only for the kinds it names. Checked in a fresh interpreter, where nothing
was imported before."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

PROBE = """
import sys
from pathlib import Path
from runner.experiments import KINDS
from runner.plan import expand
from runner.spec import load_campaign

campaign = Path(sys.argv[1])
campaign.write_text("name: lazy\\ninventory: %s\\nhosts: all\\nexperiments:\\n  - kind: selftest\\n    modes: [noop]\\n"
                    % (Path.cwd() / "inventory/local"))
plan = expand(load_campaign(campaign))
assert [t.kind for t in plan.trials] == ["selftest"]
loaded = sorted(m for m in sys.modules if m.startswith("runner.experiments.") and m != "runner.experiments.base")
print(" ".join(loaded))
print("offload" in KINDS, "nothing" in KINDS, " ".join(KINDS))
print(KINDS["offload"].name, "runner.experiments.offload" in sys.modules)
"""


def test_a_campaign_imports_only_the_kinds_it_names(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "c.yaml")], cwd=REPO, capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr
    loaded, contains, used = done.stdout.splitlines()
    kinds = [m.removeprefix("runner.experiments.") for m in loaded.split()]
    assert "selftest" in kinds
    assert not {"startup", "offload", "snapshot", "storage"} & set(kinds), kinds
    # Every kind is still listed, in registration order, and one is imported when asked for.
    assert contains == "True False facts selftest startup offload snapshot storage"
    assert used == "offload True"
