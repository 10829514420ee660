"""How ``interp`` meets SIGINT and SIGTERM, shared by the entry point (:mod:`interp.app.entry`, from the first line)
and the command line (:mod:`interp.app.cli`, around each command): both unwind like Ctrl-C and end with one line,
``interp: interrupted``, and this exit code. Imports nothing but ``signal``, so the entry point can take it before
anything heavy."""

from __future__ import annotations

import signal

INTERRUPTED = 130  # the exit code of an interrupted command (128 + SIGINT), for SIGTERM too


def interrupted(signum, frame) -> None:
    """SIGINT and SIGTERM: unwind like Ctrl-C (so half-written temp files are removed); further signals while
    unwinding are ignored, so the one line is all that is printed."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt
