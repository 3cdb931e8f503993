"""What the node's CRIU is and can do, and the dump and restore settings a real vLLM engine needs.

The first dump of a live vLLM 0.24.0 engine (API server, EngineCore, a listening socket; an H200
with CRIU 4.2.1 and its CUDA plugin) took three tries. Each is a setting here or in
``io_uring.py``:

1. CRIU cannot dump io_uring, which vLLM's API server maps ("Unknown shit 600
   (anon_inode:[io_uring])"): ``kernel.io_uring_disabled=2`` before the engine starts (``io_uring.py``).
2. An established loopback TCP connection inside the tree needs ``--tcp-established``, and CRIU
   locks it with its network-lock method, iptables by default, which was absent there ("Failed to
   lock TCP connection", "Iptables configuration failed"): ``choose_network_lock`` picks a method
   the node has.
3. The flags that then dumped and restored it: ``DEFAULT_FLAGS`` (plus ``--network-lock``).

Stdlib only: this runs on the node.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodetools.proc import run_captured

__all__ = ["DEFAULT_FLAGS", "MIN_CRIU", "NETWORK_LOCKS", "PLUGIN_DIRS", "NetworkLock", "choose_network_lock",
           "criu_build", "criu_check", "criu_feature", "criu_version", "cuda_plugin_dir", "flag_problems",
           "plugin_dirs", "remove_leftover_locks"]

MIN_CRIU = (4, 1)
PLUGIN_DIRS = ("/usr/lib/criu", "/usr/local/lib/criu")  # distribution and source builds' PLUGINDIR

# What dumped and restored a live vLLM engine (dump and restore alike; restore adds -d):
# --shell-job      the engine started from a tool, its stdin /dev/null: a job, not a daemon
# --file-locks     vLLM and its libraries hold flocks
# --tcp-established  connections inside the tree (API server to EngineCore on loopback)
# --ext-unix-sk    unix sockets whose peer is outside the tree
# --link-remap     vLLM's deleted POSIX semaphores in /dev/shm
DEFAULT_FLAGS = ("--shell-job", "--file-locks", "--tcp-established", "--ext-unix-sk", "--link-remap")
NETWORK_LOCKS = ("auto", "iptables", "nftables", "skip")
# Set by the tool itself: a flag list naming one of these is refused (bad input).
RESERVED_FLAGS = ("-t", "--tree", "-D", "--images-dir", "-W", "--work-dir", "-o", "--log-file", "-L", "--libdir",
                  "-d", "--restore-detached", "--network-lock", "--lazy-pages", "-v")
SOCCR_MARK = "0xc114"  # the packet mark CRIU's iptables rules exempt: every rule naming it is CRIU's


def criu_version(criu: str) -> tuple[int, ...] | None:
    if shutil.which(criu) is None:
        return None
    match = re.search(r"Version:\s*([\d.]+)", run_captured([criu, "--version"], 30).stdout)
    return tuple(int(p) for p in match.group(1).split(".") if p) if match else None


def criu_build(criu: str) -> dict[str, str]:
    """What ``criu --version`` says of the binary a trial runs: its path, ``version`` and, for a
    development build, the commit it prints (``gitid``); ``error`` where it does not answer."""
    path = shutil.which(criu)
    if path is None:
        return {"path": criu, "error": "not found"}
    text = run_captured([criu, "--version"], 30).stdout
    version, gitid = re.search(r"Version:\s*(\S+)", text), re.search(r"GitID:\s*(\S+)", text)
    out = {"path": path, "version": version.group(1) if version else ""}
    if gitid:
        out["gitid"] = gitid.group(1)
    if not version:
        out["error"] = f"no version in: {text.strip()[:120]!r}"
    return out


def _last_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = (done.stdout + done.stderr).strip().splitlines()
    return lines[-1].strip() if lines else f"exit {done.returncode}, no output"


def criu_check(criu: str) -> tuple[bool, str]:
    """``criu check``: (passes, its last line)."""
    done = run_captured([criu, "check"], 120)
    return "Looks good" in done.stdout + done.stderr, _last_line(done)


def criu_feature(criu: str, feature: str) -> tuple[bool, str]:
    """``criu check --feature FEATURE``: (supported, CRIU's own line)."""
    done = run_captured([criu, "check", "--feature", feature], 60)
    return done.returncode == 0, _last_line(done)


def plugin_dirs(libdir: str) -> list[str]:
    """Where CRIU looks for plugins: --libdir, then CRIU_LIBS_DIR, then the usual PLUGINDIRs."""
    return [d for d in (libdir, os.environ.get("CRIU_LIBS_DIR", ""), *PLUGIN_DIRS) if d]


def cuda_plugin_dir(libdir: str) -> str | None:
    return next((d for d in plugin_dirs(libdir) if Path(d, "cuda_plugin.so").is_file()), None)


def flag_problems(flags: list[str]) -> list[str]:
    """Why a CRIU flag list cannot be used as it is (each problem one line)."""
    problems = [f"criu flag {f!r} does not start with '-'" for f in flags if not f.startswith("-")]
    for flag in flags:
        name = flag.split("=", 1)[0]
        if name in RESERVED_FLAGS or re.fullmatch(r"-v\d*", name):
            problems.append(f"criu flag {flag!r} is set by the tool itself (network_lock, lazy_pages, images_dir, "
                            "libdir are mode parameters)")
    return problems


@dataclass
class NetworkLock:
    """The ``--network-lock`` method for this node: asked, chosen, why, and why it cannot be used."""

    asked: str
    method: str = "skip"
    why: str = ""
    problem: str = ""
    facts: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"asked": self.asked, "method": self.method, "why": self.why, **self.facts}


def choose_network_lock(asked: str, criu: str) -> NetworkLock:
    """``auto`` takes iptables where ``iptables`` and ``iptables-restore`` are on the PATH (CRIU's
    default, it runs both), else nftables where CRIU was built with libnftables and the kernel has
    what its lock needs (``criu check --feature network_lock_nftables``), else ``skip``: connections
    are then not locked while the tree is dumped. An explicit method the node lacks is a problem."""
    tools = {name: shutil.which(name) for name in ("iptables", "iptables-restore", "nft")}
    nft_ok, nft_line = criu_feature(criu, "network_lock_nftables") if shutil.which(criu) else (False, "no criu")
    facts = {"iptables": tools["iptables"], "iptables_restore": tools["iptables-restore"], "nft": tools["nft"],
             "criu_nftables_lock": nft_ok}
    has_iptables = bool(tools["iptables"] and tools["iptables-restore"])
    lock = NetworkLock(asked, facts=facts)
    if asked not in NETWORK_LOCKS:
        lock.problem = f"network_lock {asked!r} is not one of {', '.join(NETWORK_LOCKS)}"
    elif asked == "iptables" or (asked == "auto" and has_iptables):
        lock.method, lock.why = "iptables", "iptables and iptables-restore are on the PATH"
        if not has_iptables:
            lock.problem = ("network_lock iptables: iptables or iptables-restore is not on the PATH, so CRIU's lock "
                            "fails ('Iptables configuration failed'); use network_lock auto, nftables or skip")
    elif asked == "nftables" or (asked == "auto" and nft_ok):
        lock.method, lock.why = "nftables", f"criu check --feature network_lock_nftables: {nft_line}"
        if not nft_ok:
            lock.problem = (f"network_lock nftables: 'criu check --feature network_lock_nftables' says: {nft_line}; "
                            "use network_lock auto, iptables or skip")
    elif asked == "skip":
        lock.why = "asked: established TCP connections are not locked while the tree is dumped"
    else:
        lock.why = ("neither iptables nor CRIU's nftables lock on this node: established TCP connections are not "
                    "locked while the tree is dumped (a packet in flight may be lost)")
    return lock


def remove_leftover_locks(method: str) -> list[str]:
    """After a dump whose restore failed or never ran: the network-lock rules CRIU left (they drop the
    dumped connections' packets), removed where a tool can; what was done or is left, in words."""
    done: list[str] = []
    if method == "iptables":
        for tool in ("iptables", "ip6tables"):
            if shutil.which(tool) is None:
                continue
            rules = [r for r in run_captured([tool, "-S"], 60).stdout.splitlines()
                     if SOCCR_MARK in r.lower() and r.startswith("-A ")]
            for rule in rules:
                deleted = run_captured([tool, "-D", *rule.split()[1:]], 60).returncode == 0
                done.append(f"{tool} {'removed' if deleted else 'could not remove'}: {rule}")
    elif method == "nftables":
        if shutil.which("nft") is None:
            return ["nftables: CRIU's 'inet CRIU-*' table may remain (no nft here to list or remove it)"]
        for line in run_captured(["nft", "list", "tables"], 60).stdout.splitlines():
            words = line.split()
            if len(words) == 3 and words[0] == "table" and words[2].startswith("CRIU-"):
                deleted = run_captured(["nft", "delete", "table", words[1], words[2]], 60).returncode == 0
                done.append(f"nft {'removed' if deleted else 'could not remove'}: {line.strip()}")
    return done
