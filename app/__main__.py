"""``python -m interp.app``: the ``interp`` command line (signals handled from the first line, :mod:`.entry`)."""

from .entry import main

raise SystemExit(main())
