"""The ``criu`` mode: dump a started engine's process tree to disk, restore it, time it to its first token.

With ``kernel.io_uring_disabled=2`` from before the engine starts (``io_uring.py``), the network
lock chosen from the node and the flag set that dumped a live vLLM engine (``criu_node.py``):

1. the engine started and timed to its first token, ``answers`` timed answers; with ``quiesce``
   put to sleep (``quiesce.py``: its KV pool freed, its weights in host memory or dropped);
2. ``criu dump -t PID`` (the CUDA plugin suspends the GPU state, via ``cuda-checkpoint`` from
   CRIU's PATH, when the engine uses a GPU): seconds, image bytes, the filesystem of the images
   folder, the port free again, GPU memory after;
3. one restore pass per ``restore_cache`` state (``dropped``: the node's page cache dropped, the
   image read from its disk; ``warm``: the image read into the page cache first; tmpfs is RAM
   either way), each ``criu restore -d`` from the same image: seconds, the first token, the
   answers; with ``quiesce`` the restored engine is woken first (and its weights reloaded after a
   level-2 sleep); with ``--stage-dir`` the images are copied into that RAM folder first, the copy
   timed (``stage_s``), and restored from there. The tree of one pass is stopped before the next,
   the ``link_remap`` files the dump made (which a restore unlinks) are put back from a copy
   (``link_remaps.py``), and files the engine kept writing are cut back to their dumped size
   (``written_files.py``). With
   ``lazy_pages`` a ``criu lazy-pages`` daemon serves the memory on demand (userfaultfd) while
   the restored engine already runs: when it has read the whole image is recorded against the
   first token.

A failed dump leaves the engine running (CRIU thaws the tree; checked: never left frozen) and it
is then stopped cleanly. After a dump whose restore failed, the network-lock rules CRIU left are
removed. The images are removed at the end unless ``--keep-images``. Stdlib only: this runs on the node.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from nodetools import exitcodes
from nodetools.gpu import memory_used_mib
from nodetools.proc import (
    become_subreaper,
    port_open,
    reap_adopted_zombies,
    run_captured,
    signal_group,
    state,
    wait_gone,
)
from nodetools.snapshot import cuda_tool, images
from nodetools.snapshot.criu_node import choose_network_lock, criu_build, flag_problems, remove_leftover_locks
from nodetools.snapshot.engine_run import EngineRun
from nodetools.snapshot.io_uring import IoUringOff
from nodetools.snapshot.kernel_memory import ThpSetting, read_thp, read_vmstat, vmstat_delta
from nodetools.snapshot.link_remaps import LinkRemaps
from nodetools.snapshot.written_files import WrittenFiles

__all__ = ["CriuRun"]

LAZY_FINISH_S = 600  # a lazy-pages daemon still serving this long after the restore is stopped
LAZY_SOCKET = "lazy-pages.socket"  # in CRIU's work folder (-W), where the restore looks for it


class _LazyPages:
    """``criu lazy-pages``: serves the image's memory to the restored tree; the time it ends is when the
    whole image has been read."""

    def __init__(self, argv: list[str], env: dict[str, str], socket: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            socket.unlink()  # an earlier pass's: the restore must not find a dead one
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        self.ended_at: float | None = None
        threading.Thread(target=self._wait, daemon=True).start()
        # The restore connects to the daemon's socket at once: it must be listening first.
        wait_gone(lambda: not socket.exists() and self.ended_at is None, 30, 0.01)

    def _wait(self) -> None:
        self.proc.wait()
        self.ended_at = time.time()

    def finish(self, timeout_s: float) -> int | None:
        """Wait for the daemon to end; stop it after ``timeout_s``. Its exit code (None: stopped)."""
        if not wait_gone(lambda: self.ended_at is None, timeout_s, 0.05):
            signal_group(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
            return None
        return self.proc.returncode


class CriuRun(EngineRun):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.guard: IoUringOff | None = None
        self.thp: ThpSetting | None = None
        self.lock_method = "skip"
        self.criu_env = dict(os.environ)
        self.dumped = False
        self.restored = False
        self.remaps = LinkRemaps()
        self.written = WrittenFiles()

    @property
    def pid(self) -> int:
        return self.timer.proc.pid if self.timer.proc else 0

    def measure(self) -> int:
        become_subreaper()  # the tree `criu restore -d` detaches is adopted here, then reaped here
        problems = flag_problems(self.args.criu_flags)
        lock = choose_network_lock(self.args.network_lock, self.args.criu)
        self.lock_method = lock.method
        self.out["criu"] = criu_build(self.args.criu)
        self.out["criu_flags"] = list(self.args.criu_flags)
        self.out["network_lock"] = lock.as_dict()
        self.out["images_dir"] = {"path": str(self.args.images), **images.filesystem(self.args.images)}
        self.out["lazy_pages"] = self.args.lazy_pages
        plugin_path = cuda_tool.plugin_path(self.args.cuda_checkpoint, self.args.log.parent / "cuda-checkpoint-bin")
        if plugin_path:
            self.criu_env["PATH"] = plugin_path
        self.out["cuda_checkpoint_tool"] = cuda_tool.identify(
            self.args.cuda_checkpoint if plugin_path else cuda_tool.PLUGIN_RUNS)
        if problems or lock.problem:
            self.out["error"] = "; ".join([*problems, *([lock.problem] if lock.problem else [])])
            return exitcodes.BAD_INPUT
        if self.args.disable_io_uring:
            self.guard = IoUringOff(self.timer.claim.lease if self.timer.claim else None)
            self.out["io_uring"] = self.guard.record
            refused = self.guard.disable()
            if refused:
                self.out["error"] = refused
                return exitcodes.DIED
        else:
            self.out["io_uring"] = {"sysctl": "kernel.io_uring_disabled", "left_alone": True}
        return super().measure()

    def _criu(self, action: str, log: str, extra: list[str], images: Path) -> subprocess.CompletedProcess[str]:
        # -W puts the tool's log beside the server log, where the collect phase fetches it.
        return run_captured(self._argv(action, log, extra, images), self.args.timeout_s, self.criu_env)

    def _argv(self, action: str, log: str, extra: list[str], images: Path) -> list[str]:
        argv = [self.args.criu, action, "-D", str(images), "-W", str(self.args.log.parent), "-o", log, "-v4"]
        if action != "lazy-pages":
            argv += [*self.args.criu_flags, "--network-lock", self.lock_method]
        if self.args.libdir:
            argv += ["-L", self.args.libdir]
        return [*argv, *extra]

    def after_first_token(self) -> int:
        self.out["answers_before_dump_s"] = self.answers(self.args.answers)
        error = self.sleep_engine()
        if error:
            self.out["error"] = error
            return exitcodes.DIED
        self.out["gpu_mem_mib_before"] = memory_used_mib(self.timer.gpus)  # asleep, when quiesced
        self.remaps.seen(self.pid)
        self.written.seen(self.pid)
        self.out["link_remaps"] = self.remaps.record
        self.out["written_files"] = self.written.record
        rc = self._dump()
        if rc != exitcodes.OK:
            return rc
        self.out["restores"] = []
        # THP for the restores only (set after the dump: the engine ran as the node had it).
        self.thp = ThpSetting(self.args.thp, self.timer.claim.lease if self.timer.claim else None)
        self.out["thp"] = self.thp.record
        refused = self.thp.apply()
        if refused:
            self.out["error"] = refused
            return exitcodes.DIED
        for index, cache in enumerate(self.args.restore_cache):
            if index:
                self._stop_restored()
                self.remaps.put_back()  # the last restore unlinked them: this one needs them again
                self.written.put_back()  # CRIU refuses a file whose size changed since the dump
            rc = self._restore(cache)
            if rc != exitcodes.OK:
                return rc
            self.restored = True
            if not index:  # the first restore is the mode's headline figure
                first = self.out["restores"][0]
                self.out["restore_s"] = first["restore_s"]
                self.out["restore_to_first_token_s"] = first["restore_to_first_token_s"]
        return exitcodes.OK

    def _dump(self) -> int:
        images.empty(self.args.images)
        started = time.time()
        dump = self._criu("dump", "dump.log", ["-t", str(self.pid)], self.args.images)
        self.out["dump_s"] = round(time.time() - started, 4)
        if dump.returncode != 0:
            time.sleep(0.2)
            letter = state(self.pid)
            self.out["after_failed_dump"] = {"T": "frozen", "": "gone", "Z": "gone"}.get(letter, "running")
            if letter == "T":  # never leave it half-frozen
                signal_group(self.pid, signal.SIGCONT)
            asleep = f" of the engine asleep (quiesce {self.quiesce.name})" if self.quiesce.level else ""
            self.out["error"] = f"criu dump{asleep} failed with rc {dump.returncode} (see dump.log)"
            return exitcodes.DIED
        self.dumped = True
        self.remaps.keep(self._remaps_store)
        self.written.dumped()  # the tree is frozen, then gone: these are the sizes CRIU recorded
        assert self.timer.proc is not None
        self.timer.proc.wait(timeout=30)  # CRIU killed the dumped tree: reap our child
        self._wait_group_gone()
        self.out["image_bytes"] = images.size_bytes(self.args.images)
        self.out["port_free_after_dump"] = not port_open(self.timer.port)
        self.out["gpu_mem_mib_after_dump"] = memory_used_mib(self.timer.gpus)
        return exitcodes.OK

    @property
    def _remaps_store(self) -> Path:
        return self.args.images.with_name(self.args.images.name + ".link-remaps")

    def _wait_group_gone(self) -> None:
        """Until no process of the engine's group is left, zombies included: while one names the
        engine's pid as its group, a restore cannot have that pid back. Orphans adopted here are
        reaped here; others wait for their parent."""
        def left() -> bool:
            reap_adopted_zombies(self.pid)
            return signal_group(self.pid, 0)
        wait_gone(left, 30)

    def _stop_restored(self) -> None:
        signal_group(self.pid, signal.SIGKILL)  # the image is the state to come back to: nothing to save
        self._wait_group_gone()

    def _restore(self, cache: str) -> int:
        record: dict[str, Any] = images.set_cache(self.args.images, cache)
        self.out["restores"].append(record)
        source, in_ram = self.args.images, bool(self.out["images_dir"].get("in_ram"))
        if self.args.stage_dir:  # read from the disk (or page cache) as set above, into RAM
            record.update(images.stage(self.args.images, self.args.stage_dir))
            source, in_ram = self.args.stage_dir, bool(record["stage_dir"].get("in_ram"))
        record["image_source"] = "tmpfs" if in_ram else "disk"
        lazy = None
        if self.args.lazy_pages:
            lazy = _LazyPages(self._argv("lazy-pages", f"lazy-pages-{cache}.log", [], source), self.criu_env,
                              self.args.log.parent / LAZY_SOCKET)
            self.lease_group(lazy.proc.pid, "criu lazy-pages")
        record["thp"] = read_thp()
        vmstat = read_vmstat()
        started = time.time()
        lazy_flag = ["--lazy-pages"] if lazy else []
        restore = self._criu("restore", f"restore-{cache}.log", ["-d", *lazy_flag], source)
        record["restore_s"] = round(time.time() - started, 4)
        record["vmstat"] = vmstat_delta(vmstat, read_vmstat())  # how CRIU's restore brought its pages in
        if restore.returncode != 0:
            if lazy is not None:
                record["lazy_pages_rc"] = lazy.finish(5)
            self.out["error"] = f"criu restore failed with rc {restore.returncode} (see restore-{cache}.log)"
            return exitcodes.DIED
        self.out["restored_pid_same"] = state(self.pid) not in ("", "Z")
        if self.out["restored_pid_same"]:
            self.lease_group(self.pid, "engine restored by criu")  # same pid, a new start time
        error = self.wake_engine(record)  # restored asleep, as it was dumped
        if error:
            self.out["error"] = error
            return exitcodes.DIED
        got_token = self.wait_token("restore_to_first_token_s", started, record)
        if got_token:
            record["answers_s"] = self.answers(self.args.answers)
        record["gpu_mem_mib_after"] = memory_used_mib(self.timer.gpus)
        if lazy is not None:
            self._lazy_outcome(lazy, started, record)
        if not got_token:
            self.out["error"] = f"the restored engine gave no token within 120 s ({cache} page cache)"
            return exitcodes.DIED
        return exitcodes.OK

    def _lazy_outcome(self, lazy: _LazyPages, started: float, record: dict[str, Any]) -> None:
        ended_before_token = lazy.ended_at is not None
        record["lazy_pages_rc"] = lazy.finish(LAZY_FINISH_S)
        if lazy.ended_at is not None:
            record["lazy_pages_done_s"] = round(lazy.ended_at - started, 4)
        token = record.get("restore_to_first_token_s")
        if token is not None and "lazy_pages_done_s" in record:
            record["first_token_before_image_read"] = token < record["lazy_pages_done_s"]
        elif token is not None:
            record["first_token_before_image_read"] = not ended_before_token

    def stop(self) -> None:
        super().stop()
        if self.pid:
            reap_adopted_zombies(self.pid)
        if self.guard is not None:
            self.guard.restore()  # after the engine stopped: it was off for the engine's whole life
        if self.thp is not None:
            self.thp.restore()
        if self.dumped and not self.restored and self.lock_method != "skip":
            self.out["network_lock_left_after_failure"] = remove_leftover_locks(self.lock_method)
        left = self.remaps.remove_left()
        if left:
            self.out["link_remaps"]["removed_after_failure"] = left
        if not self.args.keep_images and self.args.images.exists():
            shutil.rmtree(self.args.images, ignore_errors=True)  # tens of GB a trial, on a disk or in RAM
            shutil.rmtree(self._remaps_store, ignore_errors=True)
            self.out["images_removed"] = not self.args.images.exists()
        if self.args.stage_dir and self.args.stage_dir.exists():
            shutil.rmtree(self.args.stage_dir, ignore_errors=True)  # RAM: never kept
            self.out["staged_removed"] = not self.args.stage_dir.exists()
