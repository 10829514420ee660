"""Small C functions built on this machine at run time, for the few loops torch cannot batch well.

:func:`build` compiles a C source into a shared library in a private temporary folder (a fraction of a second;
``-O3 -march=native``, so nothing built is shared with another machine), loads it with :mod:`ctypes` and removes the
folder at once (the loaded code stays mapped). A process that ends on a signal without unwinding (``os._exit`` in
the command line's handler, :mod:`interp.app.signals`) calls :func:`abandon_builds` first, which stops a compiler still
running and removes its folder. A program that calls the library and is killed by a signal it does not handle ends
without either: a compiler running at that moment finishes on its own (its own process group) and its folder stays in
the temporary directory (``interp-<name>-<random>``); such a program can call :func:`abandon_builds` from its own
handler. Each compiler on the PATH is tried in turn, with and without ``-march=native``; the error names each one's
last complaint. Callers keep a pure torch path for where no compiler is installed, and check the built code against
it before they use it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

import torch
from torch import Tensor

# C helpers shared by the kernels: vectors of 8 floats (GCC and Clang vector extensions; loads and stores through
# memcpy, so no alignment is assumed), a horizontal sum, and exp of eight non-positive numbers at once
VECTORS = r"""
typedef float v8 __attribute__((vector_size(32)));
typedef int32_t i8 __attribute__((vector_size(32)));

static inline v8 ld(const float *p) { v8 x; memcpy(&x, p, 32); return x; }
static inline void st(float *p, v8 x) { memcpy(p, &x, 32); }
static inline float hsum(v8 x) {
  return ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7]));
}

/* exp of x <= 0, eight at once, within 2 ulp of expf (Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2, and
   Cephes' degree-6 polynomial for e^r; below -87.3 it returns about 1e-38 instead of a subnormal or 0) */
static inline v8 exp8(v8 x) {
  const v8 lo = {-87.3f, -87.3f, -87.3f, -87.3f, -87.3f, -87.3f, -87.3f, -87.3f};
  const i8 below = x < lo; /* -1 where below, else 0 (a select by bits: C has no vector ?:) */
  x = (v8)(((i8)x & ~below) | ((i8)lo & below));
  const i8 n = __builtin_convertvector(x * 1.44269504088896341f - 0.5f, i8); /* ceil(x log2 e - 1/2): x <= 0 */
  const v8 nf = __builtin_convertvector(n, v8);
  const v8 r = (x - nf * 0.693359375f) + nf * 2.12194440e-4f;
  v8 p = 1.9875691500e-4f * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const i8 bits = (n + 127) << 23;
  v8 scale;
  memcpy(&scale, &bits, 32);
  return p * scale;
}
"""
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
            folder = _new_folder(name)
            try:
                os.mkdir(folder, 0o700)
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
            finally:  # unregistered last, so a signal at any moment here still finds what is left
                try:
                    proc = _RUNNING.get(folder)
                    if proc is not None:  # an interrupt that got here before _compile stopped its compiler
                        _stop(proc)
                finally:
                    shutil.rmtree(folder, ignore_errors=True)
                    with _LOCK:
                        _RUNNING.pop(folder, None)
    raise OSError(f"could not build the C {name} (" + "; ".join(complaints) + ")")


def _new_folder(name: str) -> str:
    """The path of a new private folder in the temp directory for one build, registered before :func:`build` makes
    it, so that a signal at any moment finds it (:func:`abandon_builds`). The name has 64 random bits: a registered
    name is never another's folder (``os.mkdir`` would refuse one that exists)."""
    folder = os.path.join(tempfile.gettempdir(), f"interp-{name}-{secrets.token_hex(8)}")
    with _LOCK:
        _RUNNING[folder] = None
    return folder


@contextlib.contextmanager
def _signals_held():
    """SIGINT and SIGTERM held back until the block ends, in the main thread (where Python runs its signal
    handlers; other threads' blocks are covered by ``_LOCK``, which the handler's :func:`abandon_builds` waits
    for). A signal that arrived just before is still handled inside: callers stay correct without this, it only
    narrows the moments an interrupt can fall between two steps that belong together."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _compile(command: list[str], folder: str, timeout: float = 120) -> tuple[int, str]:
    """Run a compiler for the build in ``folder``; its exit status and stderr. The compiler driver starts stages of
    its own (``cc1``, ``as``, ``collect2``, ``ld``), which killing the driver alone leaves running: so it runs in a
    process group of its own (in the caller's session), with its temp files in ``folder``, and on anything that stops
    the wait (a timeout, SIGTERM's or Ctrl-C's exception in the caller) the whole group is killed before the
    exception goes on. It is started with SIGINT and SIGTERM held (:func:`_signals_held`) until it is registered, and
    inherits them blocked; that costs nothing, as its own process group gets no terminal signals and it is stopped
    with SIGKILL."""
    env = {**os.environ, "TMPDIR": folder}  # the stages' own temp files (``cc*.s``, ``cc*.o``) go in the folder too
    with _LOCK, _signals_held():
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0, env=env
        )
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
    handler, the interrupted ``communicate`` may hold the ``Popen``'s wait lock. A Ctrl-C that lands meanwhile (a
    second one while the first unwinds) is raised once the group is dead, not in the middle."""
    interrupt = None
    while proc.returncode is None:  # not yet reaped: once it is, its pid may belong to another process
        try:
            with _signals_held():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                try:
                    _, status = os.waitpid(proc.pid, 0)
                    proc.returncode = os.waitstatus_to_exitcode(status)
                except ChildProcessError:  # reaped elsewhere
                    proc.returncode = -signal.SIGKILL
        except KeyboardInterrupt as e:
            interrupt = e
    if interrupt is not None:
        raise interrupt


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


def pointer(t: Tensor | None, dtype: torch.dtype | None = None, *, strided: bool = False) -> ctypes.c_void_p:
    """The address of a tensor's first element, for a C function to read or write (NULL for None or an empty
    tensor). The tensor must be a dense, contiguous CPU tensor whose memory holds its values (not a negated or
    conjugated view, whose sign torch applies lazily), of ``dtype`` where given: C reads it as one block of that type,
    and a copy made here would be freed before the call. ``strided=True``: C reads it at strides its caller checked
    and passed (a view of a wider buffer), so it need not be contiguous. The caller keeps the tensor alive until the
    call returns."""
    if t is None or t.numel() == 0:
        return ctypes.c_void_p(None)
    dense = strided or t.is_contiguous()
    if t.layout != torch.strided or t.device.type != "cpu" or not dense or t.is_neg() or t.is_conj():
        raise ValueError(
            f"a C function reads a dense contiguous CPU tensor holding its own values; got one on {t.device}, "
            f"layout {t.layout}, strides {t.stride() if t.layout == torch.strided else None}"
            + (", a negated or conjugated view" if t.layout == torch.strided and (t.is_neg() or t.is_conj()) else "")
        )
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"a C function reads {dtype} here; got {t.dtype}")
    return ctypes.c_void_p(t.data_ptr())


_UNFILLED = threading.Lock()  # guards the state below: unfilled() may be entered from several threads at once
# how many unfilled() blocks are open now, in any thread, and the flag as the first of them found it
_UNFILLED_STATE = {"depth": 0, "saved": True}


@contextlib.contextmanager
def unfilled():
    """New tensors left unfilled within, deterministic mode or not, for outputs a C function writes in full:
    ``torch.use_deterministic_algorithms`` otherwise fills each new tensor with NaN first, a whole pass over it (the
    attention kernel's pattern: ~15% of its time; for the token-count step's outputs and the replayed masks the fill
    measured nothing whole epochs would show, so they keep it). The flag is global: it is cleared while any thread is
    inside such a block and restored when the last one leaves (counted, so blocks that overlap across threads cannot
    leave it cleared), and another thread's new tensors in that moment go unfilled too, which only ever skips that NaN
    fill, never changes a result."""
    flag, state = torch.utils.deterministic, _UNFILLED_STATE
    with _UNFILLED:
        if state["depth"] == 0:
            state["saved"] = flag.fill_uninitialized_memory
            flag.fill_uninitialized_memory = False
        state["depth"] += 1
    try:
        yield
    finally:
        with _UNFILLED:
            state["depth"] -= 1
            if state["depth"] == 0:
                flag.fill_uninitialized_memory = state["saved"]
