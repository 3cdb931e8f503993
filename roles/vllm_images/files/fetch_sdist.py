# SPDX-License-Identifier: MIT
"""Fetch a pinned package's source distribution into a folder, for a node that builds it itself.

``build_wheelhouse.py --sdist NAME==VERSION`` uses this: the sdist travels in the wheelhouse to an
offline node, where the vllm_images role compiles it against the node's torch
(``vllm_images_build_from_source``). ``pip download`` cannot do it: it prepares an sdist's metadata
by running its build, which for LMCache means installing torch in an isolated environment
(gigabytes) or importing it on the controller. So the file is found the way pip finds it, without
building: in the ``--find-links`` folders of the pip arguments, then on the index's simple page
(PEP 503; ``--index-url``/``-i``, default PyPI's) unless ``--no-index``; the page's
``#sha256=`` fragment is checked when it has one.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

DEFAULT_INDEX = "https://pypi.org/simple/"
SDIST_SUFFIXES = (".tar.gz", ".zip")
MAX_PAGE_BYTES = 32 << 20  # a simple page lists every file of every release
MAX_SDIST_BYTES = 1 << 30
TIMEOUT_S = 120


class SdistError(Exception):
    """A problem the user must fix: the message names what and where."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pin(value: str) -> tuple[str, str]:
    name, sep, version = value.partition("==")
    if not sep or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name) or not re.fullmatch(r"[A-Za-z0-9_.!+]+",
                                                                                             version):
        raise SdistError(f"--sdist {value!r}: write NAME==VERSION")
    return name, version


def is_sdist_of(filename: str, name: str, version: str) -> bool:
    """``lmcache-0.5.6.tar.gz`` (or ``LMCache-0.5.6.zip``) is an sdist of lmcache==0.5.6."""
    suffix = next((s for s in SDIST_SUFFIXES if filename.endswith(s)), None)
    if not suffix:
        return False
    stem_name, _, stem_version = filename[: -len(suffix)].rpartition("-")
    return canonical(stem_name) == canonical(name) and stem_version == version


def pip_sources(pip_args: list[str]) -> tuple[list[str], list[str]]:
    """The --find-links places and the simple pages of the indexes (none with --no-index) these pip arguments name."""
    links: list[str] = []
    index, extra, no_index = DEFAULT_INDEX, [], False
    args = iter(pip_args)
    for arg in args:
        key, eq, value = arg.partition("=")
        if key in ("--find-links", "-f", "--index-url", "-i", "--extra-index-url") and not eq:
            value = next(args, "")
        if key in ("--find-links", "-f"):
            links.append(value)
        elif key in ("--index-url", "-i"):
            index = value
        elif key == "--extra-index-url":
            extra.append(value)
        elif arg == "--no-index":
            no_index = True
    return links, [] if no_index else [index, *extra]


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.hrefs.append(href)


def _read(url: str, limit: int) -> bytes:
    request = urllib.request.Request(url, headers={"Accept": "text/html", "User-Agent": "build_wheelhouse"})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
        data = response.read(limit + 1)
    if len(data) > limit:
        raise SdistError(f"{url}: larger than {limit} bytes")
    return data


def _from_page(page: str, name: str, version: str, dest: Path) -> Path | None:
    """The sdist a simple page (an index's page of the package, or a --find-links page) links to, fetched."""
    try:
        parser = _Links()
        parser.feed(_read(page, MAX_PAGE_BYTES).decode(errors="replace"))
    except OSError as exc:
        raise SdistError(f"{page}: {exc}") from exc
    for href in parser.hrefs:
        path, _, fragment = urllib.parse.urljoin(page, href).partition("#")
        filename = urllib.parse.unquote(path.rsplit("/", 1)[-1])
        if not is_sdist_of(filename, name, version):
            continue
        try:
            data = _read(path, MAX_SDIST_BYTES)
        except OSError as exc:
            raise SdistError(f"{path}: {exc}") from exc
        want = dict(urllib.parse.parse_qsl(fragment)).get("sha256")
        if want and hashlib.sha256(data).hexdigest() != want:
            raise SdistError(f"{path}: sha256 {hashlib.sha256(data).hexdigest()}, the index says {want}")
        tmp = dest / f".{filename}.tmp"
        tmp.write_bytes(data)
        return tmp.replace(dest / filename)
    return None


def _from_folder(folder: Path, name: str, version: str, dest: Path) -> Path | None:
    found = sorted(p for p in folder.glob("*") if is_sdist_of(p.name, name, version)) if folder.is_dir() else []
    if not found:
        return None
    shutil.copyfile(found[0], dest / found[0].name)
    return dest / found[0].name


def fetch(pin: str, dest: Path, pip_args: list[str]) -> str:
    """Put NAME==VERSION's sdist into ``dest``; returns the line saying where it went."""
    name, version = parse_pin(pin)
    dest.mkdir(parents=True, exist_ok=True)
    kept = sorted(p for p in dest.iterdir() if is_sdist_of(p.name, name, version))
    if kept:
        return f"sdist: {kept[0]} (already there; sha256 {sha256(kept[0])})"
    links, indexes = pip_sources(pip_args)
    places = [*links, *(urllib.parse.urljoin(i.rstrip("/") + "/", canonical(name) + "/") for i in indexes)]
    for place in places:
        if place.startswith(("http://", "https://")):
            got = _from_page(place, name, version, dest)
        else:
            got = _from_folder(Path(place.removeprefix("file://")), name, version, dest)
        if got:
            return f"sdist: {got} (from {place}; sha256 {sha256(got)})"
    raise SdistError(f"no source distribution of {name}=={version} in "
                     + (", ".join(places) or "nowhere (--no-index and no --find-links)"))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
