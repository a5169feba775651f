"""``python -m scripts.results`` (:mod:`scripts.results.cli`)."""

from scripts.results.cli import main

raise SystemExit(main())
