"""``python -m nodetools.snapshot gates|measure ...`` (see ``cli.py``)."""

from nodetools.snapshot.cli import main

raise SystemExit(main())
