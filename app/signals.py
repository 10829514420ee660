"""How ``interp`` meets SIGINT and SIGTERM, shared by the entry point (:mod:`interp.app.entry`, from the first line)
and the command line (:mod:`interp.app.cli`, around each command): both end with one line, ``interp: interrupted``,
and this exit code, leaving no half-written output behind. Imports nothing heavy, so the entry point can take it
before anything else.

Two ways to stop, one per caller:

- :func:`exit_now`, for the ``interp`` process itself: remove the temp files of outputs being written (the ones
  :class:`interp.files.AtomicFile` holds), run the registered :data:`cleanups`, print the line and end the process.
  It raises nothing, so no library can swallow the interrupt (a ``try: ... except BaseException`` around an import
  turned it into a normal exit 0), and no C++ code that called back into Python sees an exception it cannot carry
  (torch's ``_c10d_init`` during ``import torch`` then aborts the process: ``terminate called after throwing an
  instance of 'pybind11::error_already_set'``, exit 134).
- :func:`interrupted`, for a caller that runs the command line inside its own process (``main(argv)``): unwind like
  Ctrl-C, so its ``finally`` blocks run and the caller gets exit code 130 back.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable

INTERRUPTED = 130  # the exit code of an interrupted command (128 + SIGINT), for SIGTERM too
received: list[int] = []  # the signals handled in this process
cleanups: list[Callable[[], None]] = []  # run (last first) by exit_now before the process ends


def _ignore_further() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def interrupted(signum, frame) -> None:
    """SIGINT and SIGTERM inside a caller's process: unwind like Ctrl-C (so half-written temp files are removed);
    further signals while unwinding are ignored, so the one line is all that is printed."""
    received.append(signum)
    _ignore_further()
    raise KeyboardInterrupt


def run_cleanups() -> None:
    """Remove the temp files of outputs being written, stop any C build still compiling (its compiler and folder),
    and run :data:`cleanups`, last registered first; a cleanup that fails does not stop the others."""
    files = sys.modules.get("interp.files")  # only if something was written: importing it here could be slow
    if files is not None:
        files.discard_open_temps()
    native = sys.modules.get("interp.native")  # only if a C function was built: a compiler may still be running
    if native is not None:
        native.abandon_builds()
    while cleanups:
        with contextlib.suppress(BaseException):
            cleanups.pop()()


def exit_now(signum, frame) -> None:
    """SIGINT and SIGTERM in the ``interp`` process: clean up, print ``interp: interrupted``, exit 130 at once."""
    received.append(signum)
    _ignore_further()
    run_cleanups()
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    with contextlib.suppress(OSError, ValueError):
        announce()
    os._exit(INTERRUPTED)


def announce() -> None:
    """Print ``interp: interrupted`` on stderr, on a line of its own: after a newline where a progress bar (tqdm)
    was drawing on that line."""
    tqdm = sys.modules.get("tqdm")
    bars = getattr(getattr(tqdm, "tqdm", None), "_instances", None)
    print(("\n" if bars else "") + "interp: interrupted", file=sys.stderr, flush=True)


def handled(handler) -> bool:
    """Whether ``handler`` is one of this module's (the command line then leaves it in place)."""
    return handler in (interrupted, exit_now)
