"""Small C functions built on this machine at run time, for the few loops torch cannot batch well.

:func:`build` compiles a C source into a shared library in a private temporary folder (a fraction of a second;
``-O3 -march=native``, so nothing built is shared with another machine), loads it with :mod:`ctypes` and removes the
folder at once (the loaded code stays mapped), so no process leaves files behind. A process that ends on a signal
without unwinding (``os._exit`` in the command line's handler, :mod:`interp.app.signals`) calls
:func:`abandon_builds` first, which stops a compiler still running and removes its folder. Each compiler on the PATH is
tried in turn, with and without ``-march=native``; the error names each one's last complaint. Callers keep a pure
torch path for where no compiler is installed, and check the built code against it before they use it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

COMPILERS = ("cc", "gcc", "clang", "g++", "c++", "clang++")
_RUNNING: dict[str, subprocess.Popen | None] = {}  # each build's private folder -> its compiler while one runs
_LOCK = threading.RLock()  # re-entrant: the signal handler may run while this thread holds it


def build(source: str, name: str) -> ctypes.CDLL:
    """``source`` (C, also valid C++: declare the exported functions ``extern "C"``) compiled and loaded as
    ``name``; ``OSError`` saying why where no compiler on the PATH builds it."""
    found = [c for c in COMPILERS if shutil.which(c)]
    if not found:
        raise OSError("no C compiler on the PATH (looked for " + ", ".join(COMPILERS) + ")")
    complaints = []
    for compiler in found:
        for flags in (["-O3", "-march=native"], ["-O3"]):
            folder = tempfile.mkdtemp(prefix=f"interp-{name}-")
            with _LOCK:
                _RUNNING[folder] = None
            try:
                src = Path(folder) / (f"{name}.cpp" if "++" in compiler else f"{name}.c")
                src.write_text(source)
                lib = Path(folder) / f"{name}.so"
                command = [compiler, *flags, "-shared", "-fPIC", "-o", str(lib), str(src), "-lm"]
                returncode, stderr = _compile(command, folder)
                if returncode == 0:
                    return ctypes.CDLL(str(lib))
                last = (stderr.strip().splitlines() or [f"exit status {returncode}"])[-1]
                complaints.append(f"{compiler} {' '.join(flags)}: {last}")
            except (OSError, subprocess.SubprocessError) as e:
                complaints.append(f"{compiler} {' '.join(flags)}: {e}")
            finally:
                shutil.rmtree(folder, ignore_errors=True)
                with _LOCK:
                    _RUNNING.pop(folder, None)
    raise OSError(f"could not build the C {name} (" + "; ".join(complaints) + ")")


def _compile(command: list[str], folder: str, timeout: float = 120) -> tuple[int, str]:
    """Run a compiler for the build in ``folder``; its exit status and stderr. The compiler driver starts stages of
    its own (``cc1``, ``as``, ``collect2``, ``ld``), which killing the driver alone leaves running: so it runs in a
    process group of its own (in the caller's session), with its temp files in ``folder``, and on anything that stops
    the wait (a timeout, SIGTERM's or Ctrl-C's exception in the caller) the whole group is killed before the
    exception goes on."""
    env = {**os.environ, "TMPDIR": folder}  # the stages' own temp files (``cc*.s``, ``cc*.o``) go in the folder too
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0, env=env
    )
    with _LOCK:
        if folder in _RUNNING:  # a build's folder (build adds and removes it)
            _RUNNING[folder] = proc
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except BaseException:
        _stop(proc)
        raise
    return proc.returncode, stderr


def _stop(proc: subprocess.Popen) -> None:
    """Kill a compiler's whole process group and reap its driver. ``os.waitpid``, not ``proc.wait``: from a signal
    handler, the interrupted ``communicate`` may hold the ``Popen``'s wait lock."""
    if proc.returncode is not None:  # already reaped: its pid may belong to another process now
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        _, status = os.waitpid(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)


def abandon_builds() -> None:
    """Stop every compiler still running for :func:`build` and remove the builds' folders: for a process about to
    end without unwinding (a signal handler that calls ``os._exit``), which would otherwise leave the compiler
    running after it and its folder in the temp directory. Any thread's build; safe to call at any time."""
    with _LOCK:
        running = list(_RUNNING.items())
        _RUNNING.clear()
    for folder, proc in running:
        if proc is not None:
            _stop(proc)
        shutil.rmtree(folder, ignore_errors=True)
