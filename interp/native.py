"""Small C functions built on this machine at run time, for the few loops torch cannot batch well.

:func:`build` compiles a C source into a shared library in a private temporary folder (a fraction of a second;
``-O3 -march=native``, so nothing built is shared with another machine), loads it with :mod:`ctypes` and removes the
folder at once (the loaded code stays mapped), so no process leaves files behind. Each compiler on the PATH is
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
from pathlib import Path

COMPILERS = ("cc", "gcc", "clang", "g++", "c++", "clang++")


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
            try:
                src = Path(folder) / (f"{name}.cpp" if "++" in compiler else f"{name}.c")
                src.write_text(source)
                lib = Path(folder) / f"{name}.so"
                returncode, stderr = _compile([compiler, *flags, "-shared", "-fPIC", "-o", str(lib), str(src), "-lm"])
                if returncode == 0:
                    return ctypes.CDLL(str(lib))
                last = (stderr.strip().splitlines() or [f"exit status {returncode}"])[-1]
                complaints.append(f"{compiler} {' '.join(flags)}: {last}")
            except (OSError, subprocess.SubprocessError) as e:
                complaints.append(f"{compiler} {' '.join(flags)}: {e}")
            finally:
                shutil.rmtree(folder, ignore_errors=True)
    raise OSError(f"could not build the C {name} (" + "; ".join(complaints) + ")")


def _compile(command: list[str], timeout: float = 120) -> tuple[int, str]:
    """Run a compiler; its exit status and stderr. The compiler driver starts stages of its own (``cc1``, ``as``,
    ``ld``), which killing the driver alone leaves running: so it runs in a process group of its own (in the
    caller's session), and on anything that stops the wait (a timeout, SIGTERM's or Ctrl-C's exception in the
    caller) the whole group is killed before the exception goes on."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0)
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return proc.returncode, stderr
