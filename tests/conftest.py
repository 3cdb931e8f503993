"""Shared fixtures: campaign files written per test next to a copy of the local inventory."""

from __future__ import annotations

import hashlib
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# A shell starts a background job with SIGINT ignored, and an ignored signal stays ignored across
# exec: a suite started as `scripts/test.sh &` would hand every runner it starts a Ctrl-C that the
# runner never sees, and the interrupt tests would fail. Python's own handler, as in a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _own_facts_cache(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own facts cache (runner/facts_cache.py), never the user's: a test that runs a
    campaign sees its hosts' facts read unless it ran one before (made only when written)."""
    name = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:16]
    monkeypatch.setenv("GPU_CAMPAIGN_CACHE", str(tmp_path_factory.getbasetemp() / "facts-cache" / name))


@pytest.fixture
def write_campaign(tmp_path: Path) -> Callable[[str], Path]:
    """Write campaign text next to a copy of the local inventory; return the file's path."""
    inv = tmp_path / "inventory"
    inv.mkdir(exist_ok=True)
    (inv / "hosts.yml").write_text((REPO / "inventory/local/hosts.yml").read_text())

    def write(text: str, name: str = "campaign.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return write
