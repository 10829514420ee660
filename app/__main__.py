"""``python -m interp.app``: the ``interp`` command line."""

from .cli import main

raise SystemExit(main())
