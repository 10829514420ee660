"""The ``interp`` command's entry point (the ``interp`` script and ``python -m interp.app``): the signal handlers
first, then the command line (:mod:`interp.app.cli`).

Importing the command line and the libraries behind it takes a noticeable part of a second, and a Ctrl-C (SIGINT)
in that time printed a traceback from inside whatever was being imported, while a SIGTERM killed the process
unannounced. This module imports nothing but ``signal``, ``sys`` and :mod:`interp.app.signals`, so from its first
line on both are handled as a later interruption is: ``interp: interrupted`` on stderr, exit 130, no traceback. Only
the interpreter's own start-up, before any line of the toolkit runs, is out of its reach. The process's own command
line ends by :func:`~interp.app.signals.exit_now` (nothing raised into whatever is running); a caller's
``main(argv)`` unwinds by :func:`~interp.app.signals.interrupted` and gets 130 back.
"""

from __future__ import annotations

import signal
import sys

from .signals import INTERRUPTED, announce, exit_now, interrupted, received


def main(argv: list[str] | None = None) -> int:
    """Run ``interp ARGV`` with SIGINT and SIGTERM handled from the start (see the module doc). Run as the process's
    command (``argv`` None: ``sys.argv``), an interrupted run ends the process here with exit code 130
    (:func:`_exit_now`); with ``argv`` given it returns 130."""
    previous = {}
    handler = exit_now if argv is None else interrupted
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread: leave signals alone
        pass
    try:
        from .cli import main as run

        rc = run(argv)
        if received:  # the interrupt was swallowed on its way up (a library's `except BaseException`)
            announce()
            rc = INTERRUPTED
    except KeyboardInterrupt:
        announce()
        rc = INTERRUPTED
    except Exception:
        # A library may turn the KeyboardInterrupt our handler raised into its own error (transformers' lazy
        # imports re-raise whatever an import raised as ModuleNotFoundError): after a signal, that is the interrupt.
        if not received:
            raise
        announce()
        rc = INTERRUPTED
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if rc == INTERRUPTED and argv is None:  # the process's own command line: end the process now
        _exit_now(rc)
    return rc


def _exit_now(rc: int) -> None:
    """Exit with ``rc`` now, the streams flushed. CPython ends a process whose KeyboardInterrupt once passed through
    code an extension ran with ``PyRun_*`` (as an import inside torch can be) by re-sending itself SIGINT at exit,
    even after the interrupt was caught and reported: exit code -2, not 130. Everything that cleans up (temp files,
    a Ray cluster this process started) ran while the interrupt unwound, before this point."""
    import contextlib
    import os

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(rc)
