"""The hosts a data-only inventory gives, kept between runs (runner/spec/hosts.py): the same answer
without importing Ansible while the inventory files, the pattern, the limit and Ansible's
configuration are the same; a new answer as soon as one of them changes; never for ``-i``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runner.inventory import InventorySources
from runner.spec.hosts import resolve_hosts
from runner.user_cache import CACHE_VARIABLE

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "cache"))
    path = tmp_path / "inventory" / "hosts.yml"
    path.parent.mkdir()
    path.write_text("all:\n  children:\n    gpu:\n      hosts:\n        h1:\n        h2:\n"
                    "    cpu:\n      hosts:\n        c1:\n")
    return path


def _data(path: Path) -> InventorySources:
    return InventorySources.of([path], from_command_line=False)


def _entries(tmp_path: Path) -> int:
    folder = tmp_path / "cache" / "hosts"
    return len(list(folder.iterdir())) if folder.is_dir() else 0


def test_a_second_resolution_takes_the_first_ones_hosts_without_ansible(inventory: Path) -> None:
    code = ("import sys; from runner.inventory import InventorySources; from runner.spec.hosts import resolve_hosts; "
            f"sources = InventorySources.of([{str(inventory)!r}], from_command_line=False); "
            "print(resolve_hosts(sources, 'gpu', None, None)[0], 'ansible' in sys.modules)")
    runs = [subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                           check=True).stdout.strip() for _ in range(2)]
    assert runs == ["['h1', 'h2'] True", "['h1', 'h2'] False"]


def test_an_edited_inventory_another_pattern_or_limit_is_resolved_again(inventory: Path, tmp_path: Path) -> None:
    assert resolve_hosts(_data(inventory), "gpu", None, None) == (["h1", "h2"], [])
    assert resolve_hosts(_data(inventory), "gpu", None, None) == (["h1", "h2"], [])  # from the cache
    assert _entries(tmp_path) == 1
    assert resolve_hosts(_data(inventory), "gpu", "h2", None) == (["h2"], [])
    assert resolve_hosts(_data(inventory), "all", None, None) == (["h1", "h2", "c1"], [])  # inventory order
    inventory.write_text(inventory.read_text().replace("        h2:\n", "        h2:\n        h3:\n"))
    assert resolve_hosts(_data(inventory), "gpu", None, None) == (["h1", "h2", "h3"], [])
    assert _entries(tmp_path) == 4


def test_ansible_settings_are_part_of_the_key(inventory: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    resolve_hosts(_data(inventory), "gpu", None, None)
    monkeypatch.setenv("ANSIBLE_HOST_PATTERN_MISMATCH", "ignore")
    resolve_hosts(_data(inventory), "gpu", None, None)
    config = tmp_path / "my.cfg"
    config.write_text("[defaults]\n")
    monkeypatch.setenv("ANSIBLE_CONFIG", str(config))
    resolve_hosts(_data(inventory), "gpu", None, None)
    config.write_text("[inventory]\nignore_extensions = .yml\n")
    resolve_hosts(_data(inventory), "gpu", None, None)
    assert _entries(tmp_path) == 4


def test_problems_and_command_line_inventories_are_never_cached(inventory: Path, tmp_path: Path) -> None:
    hosts, problems = resolve_hosts(_data(inventory), "nothere", None, None)
    assert hosts == [] and "matches no host" in problems[0][1]
    assert _entries(tmp_path) == 0
    from_i = InventorySources.of([inventory], from_command_line=True)  # -i: Ansible's configured plugins
    assert resolve_hosts(from_i, "gpu", None, "-i") == (["h1", "h2"], [])
    assert _entries(tmp_path) == 0


def test_a_broken_entry_is_resolved_again(inventory: Path, tmp_path: Path) -> None:
    resolve_hosts(_data(inventory), "gpu", None, None)
    (entry,) = (tmp_path / "cache" / "hosts").iterdir()
    entry.write_text(json.dumps({"hosts": "h9"}))
    assert resolve_hosts(_data(inventory), "gpu", None, None) == (["h1", "h2"], [])
    assert json.loads(entry.read_text()) == {"hosts": ["h1", "h2"]}


def test_a_limit_read_from_a_file_is_never_cached(inventory: Path, tmp_path: Path) -> None:
    limit = tmp_path / "limit.txt"
    limit.write_text("h1\n")
    assert resolve_hosts(_data(inventory), "gpu", f"@{limit}", None) == (["h1"], [])
    limit.write_text("h2\n")  # the same -l text, another host
    assert resolve_hosts(_data(inventory), "gpu", f"@{limit}", None) == (["h2"], [])
    assert _entries(tmp_path) == 0
