"""A host's facts kept between runs (runner/facts_cache.py): served only while fresh, for the same
host of the same inventory files, and written to the results folder as a read would write them."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from runner.execute import PhaseResult
from runner.facts_cache import CACHE_VARIABLE, FactsCache
from runner.host_checks import HostFacts
from runner.store import ResultsStore

FACTS = {"gpus": [], "memory": {"total_bytes": 2**34}, "numa": [], "kernel": "6.8.0", "page_cache_bytes": 2**30}


@pytest.fixture
def inventory(tmp_path: Path) -> list[str]:
    path = tmp_path / "inventory" / "hosts.yml"
    path.parent.mkdir()
    path.write_text("all:\n  hosts:\n    h1:\n    h2:\n")
    return [str(path)]


def test_fresh_facts_come_back_with_their_age(tmp_path: Path, inventory: list[str]) -> None:
    cache = FactsCache(tmp_path / "cache")
    cache.put(inventory, "h1", FACTS, time.time() - 5)
    facts, age = cache.get(inventory, "h1") or ({}, -1.0)
    assert facts == FACTS and 5 <= age < 60


def test_stale_or_forced_facts_are_read_again(tmp_path: Path, inventory: list[str]) -> None:
    cache = FactsCache(tmp_path / "cache", max_age_s=600)
    cache.put(inventory, "h1", FACTS, time.time() - 601)
    assert cache.get(inventory, "h1") is None  # older than the limit
    cache.put(inventory, "h1", FACTS, time.time() + 60)
    assert cache.get(inventory, "h1") is None  # from the future: a clock that went back
    cache.put(inventory, "h1", FACTS, time.time())
    assert FactsCache(tmp_path / "cache", max_age_s=0).get(inventory, "h1") is None  # --fresh-facts


def test_another_host_or_an_edited_inventory_has_no_entry(tmp_path: Path, inventory: list[str]) -> None:
    cache = FactsCache(tmp_path / "cache")
    cache.put(inventory, "h1", FACTS, time.time())
    assert cache.get(inventory, "h2") is None
    copy = tmp_path / "elsewhere" / "hosts.yml"  # the same text at another path: maybe another site
    copy.parent.mkdir()
    copy.write_text(Path(inventory[0]).read_text())
    assert cache.get([str(copy)], "h1") is None
    Path(inventory[0]).write_text("all:\n  hosts:\n    h1:\n      ansible_host: 10.0.0.9\n")
    assert cache.get(inventory, "h1") is None


def test_a_broken_entry_or_folder_is_skipped_never_a_failure(tmp_path: Path, inventory: list[str]) -> None:
    cache = FactsCache(tmp_path / "cache")
    cache.put(inventory, "h1", FACTS, time.time())
    (entry,) = (tmp_path / "cache").iterdir()
    entry.write_text(json.dumps({"read_at": time.time(), "host": "h1", "facts": {"gpus": "none"}}))
    assert cache.get(inventory, "h1") is None  # the wrong shape
    entry.write_text("{")
    assert cache.get(inventory, "h1") is None
    (tmp_path / "file").write_text("")
    blocked = FactsCache(tmp_path / "file" / "cache")
    blocked.put(inventory, "h1", FACTS, time.time())  # cannot be written: nothing raised
    assert blocked.get(inventory, "h1") is None


def test_the_default_folder_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "c"))
    assert FactsCache.default().folder == tmp_path / "c" / "facts"
    monkeypatch.delenv(CACHE_VARIABLE)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert FactsCache.default(0).folder == tmp_path / "xdg" / "gpu-campaign" / "facts"


def test_host_facts_read_by_a_run_are_cached_and_serve_the_next_run(tmp_path: Path, inventory: list[str]) -> None:
    cache = FactsCache(tmp_path / "cache")
    store = ResultsStore.open(tmp_path / "run1")
    trial_dir = store.begin_trial("selftest.noop.r1@h1")
    first = HostFacts(store, "h1", cache, inventory)
    assert not first.use_cache() and first.pending  # nothing cached yet: the first trial reads them
    first.dest(trial_dir).parent.mkdir(parents=True)
    first.dest(trial_dir).write_text(json.dumps(FACTS))
    first.settle(trial_dir, PhaseResult("run", "successful", 0, 1.0, 2.0, ""))
    assert first.cached_age_s is None

    later = ResultsStore.open(tmp_path / "run2")
    second = HostFacts(later, "h1", cache, inventory)
    assert second.use_cache() and not second.pending and second.error == ""
    assert second.facts == FACTS and second.cached_age_s is not None and second.cached_age_s >= 0
    assert json.loads((later.root / "hosts/h1/facts.json").read_text()) == FACTS
    assert not HostFacts(later, "h1", FactsCache(tmp_path / "cache", 0), inventory).use_cache()


def test_a_large_file_counts_by_size_and_time_and_a_huge_tree_is_not_cached(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inventory: list[str]) -> None:
    from runner import user_cache

    folder = Path(inventory[0]).parent
    big = folder / "files" / "wheel.whl"  # a carried build beside the inventory: never read whole
    big.parent.mkdir()
    big.write_bytes(b"\0" * (user_cache._BYTES_READ + 1))
    cache = FactsCache(tmp_path / "cache")
    cache.put([str(folder)], "h1", FACTS, time.time())
    assert cache.get([str(folder)], "h1") is not None
    stat = big.stat()
    os.utime(big, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # rewritten: another entry
    assert cache.get([str(folder)], "h1") is None

    monkeypatch.setattr(user_cache, "_MAX_FILES", 1)  # the folder holds 2 files
    assert user_cache.files_digest([str(folder)]) is None
    entries = set((tmp_path / "cache").glob("*.json"))
    cache.put([str(folder)], "h1", FACTS, time.time())
    assert cache.get([str(folder)], "h1") is None and set((tmp_path / "cache").glob("*.json")) == entries


def test_vars_beside_an_inventory_file_and_through_a_link_are_part_of_the_key(
        tmp_path: Path, inventory: list[str]) -> None:
    """Ansible reads group_vars/ and host_vars/ beside an inventory file, links followed: a new
    ansible_host there is another machine, whose facts these are not."""
    real = tmp_path / "site-vars"
    real.mkdir()
    (real / "h1.yml").write_text("ansible_host: 10.0.0.1\n")
    (Path(inventory[0]).parent / "host_vars").symlink_to(real)
    cache = FactsCache(tmp_path / "cache")
    cache.put(inventory, "h1", FACTS, time.time())
    assert cache.get(inventory, "h1") is not None
    (real / "h1.yml").write_text("ansible_host: 10.0.0.2\n")
    assert cache.get(inventory, "h1") is None
    (real / ".h1.yml.swp").write_text("an editor's file")  # hidden: Ansible skips it, so does the key
    cache.put(inventory, "h1", FACTS, time.time())
    (real / ".h1.yml.swp").write_text("changed")
    assert cache.get(inventory, "h1") is not None
