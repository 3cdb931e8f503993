"""A MOCK ``vllm`` package for tests (no GPU here): ``vllm/entrypoints/cli/main.py`` is the source
a test gives, so ``python -m vllm.entrypoints.cli.main`` on that PYTHONPATH runs it, as the
borrowed H200's --target install of vLLM runs."""

from __future__ import annotations

from pathlib import Path


def mock_vllm_site(root: Path, cli_main: str) -> Path:
    """``root`` holding the MOCK package, with ``cli_main`` as its CLI; returns ``root``."""
    cli = root / "vllm" / "entrypoints" / "cli"
    cli.mkdir(parents=True)
    for folder in (root / "vllm", root / "vllm" / "entrypoints", cli):
        (folder / "__init__.py").write_text('"""MOCK vllm package for tests."""\n')
    (cli / "main.py").write_text(cli_main)
    return root
