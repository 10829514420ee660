"""Writing output files atomically: a temp file in the target folder, then a rename.

Readers never see a half-written file, and a failure leaves nothing behind. :class:`AtomicFile` reserves
the temp file when it is created, so an unwritable path fails before any expensive work. Temp files are named
``.NAME.PID.XXXX.tmp``; one left by a process that was killed (``kill -9``) is removed the next time that output
is written (only when its process is gone: a concurrent writer's file is left alone).

An output path must be a regular file or a new name (:func:`check_output_path`, which every writer goes through:
:class:`AtomicFile`, and the command line for each ``--out`` before any work): the rename would otherwise replace
what is there with a regular file, turning a FIFO, a device node (``/dev/full``, as root) or a symbolic link into a
file. So these, a directory and an empty path are refused in one line naming what the path is. A sweep's output is
a directory (``directory=True``): a directory, a symbolic link to one (its files are written inside, the link
itself is never replaced) or a new name.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from .errors import ConfigError, InterpError


def _kind(mode: int) -> str | None:
    """What a file of ``mode`` (``os.lstat``) is, in words, where it is not a regular file, a directory or a link."""
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a device (character device node)"
    if stat.S_ISBLK(mode):
        return "a device (block device node)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return None


def check_output_path(path, what: str = "a file", *, directory: bool = False) -> Path:
    """``path`` as a Path, where an output may be written there: a regular file (replaced) or a new name in an
    existing directory; with ``directory=True`` a directory (or a symbolic link to one) or a new name, whose missing
    parents are made with it (as ``mkdir -p``) where the nearest existing one is a directory. Anything else
    (an empty path, a FIFO, a device node, a socket, a symbolic link to a file, a directory where a file is
    expected, a file where a directory is) is an InterpError ``cannot write WHAT to PATH: it is ...``, raised before
    anything is created."""
    text = os.fspath(path) if isinstance(path, os.PathLike) else path
    if not isinstance(text, str):
        raise InterpError(f"cannot write {what}: expected a path, got {type(path).__name__}")
    if not text.strip():
        raise InterpError(f"cannot write {what}: the path is empty; expected a file name")
    p = Path(text)

    def fail(why: str):
        raise InterpError(f"cannot write {what} to {p}: {why}")

    try:
        mode = os.lstat(p).st_mode
    except FileNotFoundError:
        mode = None
    except NotADirectoryError:  # a file where a folder of the path should be
        fail(f"{next(a for a in p.parents if a.exists() and not a.is_dir())} is not a directory")
    except OSError as e:
        fail(e.strerror or str(e))
    if mode is not None:
        kind = _kind(mode)
        if kind is not None:
            fail(f"it is {kind}, not a regular file; give the path of a regular file or a new name")
        if stat.S_ISLNK(mode):
            if directory and p.is_dir():
                return p
            fail(
                f"it is a symbolic link (to {os.readlink(p)}): writing would replace the link by a file; give the "
                "path it points to, or a new name"
            )
        if stat.S_ISDIR(mode) and not directory:
            fail("it is a directory; expected a file path")
        if stat.S_ISREG(mode) and directory:
            fail("it is a file; expected a directory (or a new name)")
        return p
    parent = p.parent if str(p.parent) else Path(".")
    if directory:  # a new directory is made with its missing parents (mkdir -p): the nearest existing one must be one
        ancestor = next((a for a in (parent, *parent.parents) if a.exists()), Path("."))
        if not ancestor.is_dir():
            fail(f"{ancestor} is not a directory")
        return p
    if not parent.exists():
        fail(f"directory {parent} does not exist")
    if not parent.is_dir():
        fail(f"{parent} is not a directory")
    return p


_OPEN_TEMPS: set[Path] = set()  # the temp files of AtomicFiles not yet committed or discarded, in this process


def discard_open_temps() -> None:
    """Remove the temp files of every output still being written (for a process about to end on a signal)."""
    for tmp in list(_OPEN_TEMPS):
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        _OPEN_TEMPS.discard(tmp)


class AtomicFile:
    """An output path checked (:func:`check_output_path`) and reserved up front; :meth:`commit` fills it and renames
    it into place. Used as a context manager, the temp file is removed if nothing was committed."""

    def __init__(self, path, what: str = "a file"):
        self.tmp: Path | None = None
        self.path = check_output_path(path, what)
        self.what = what
        parent = self.path.parent if str(self.path.parent) else Path(".")
        remove_stale_temps(self.path)
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.{os.getpid()}.", suffix=".tmp", dir=parent)
        except OSError as e:
            self._fail(f"{e.strerror or e} in {parent}")
        os.close(fd)
        self.tmp = Path(tmp)
        _OPEN_TEMPS.add(self.tmp)

    def _fail(self, why: str):
        raise InterpError(f"cannot write {self.what} to {self.path}: {why}")

    def commit(self, write: Callable[[str], None]) -> Path:
        """Call ``write(temp_path)``, give the file the usual permissions, rename it onto the path."""
        if self.tmp is None:
            self._fail("it was already written or discarded")
        try:
            write(str(self.tmp))
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(self.tmp, 0o666 & ~umask)  # mkstemp makes 0600 files
            check_output_path(self.path, self.what)  # still a regular file or a new name (checked again at the end)
            os.replace(self.tmp, self.path)
        except OSError as e:
            self._fail(e.strerror or str(e))
        finally:
            self.discard()
        return self.path

    def discard(self) -> None:
        if self.tmp is not None:
            self.tmp.unlink(missing_ok=True)
            _OPEN_TEMPS.discard(self.tmp)
            self.tmp = None

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, *exc) -> None:
        self.discard()


def remove_stale_temps(path) -> list[Path]:
    """Remove the temp files of ``path`` that dead processes left behind; return them."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    removed = []
    for tmp in parent.glob(f".{path.name}.*.tmp"):
        pid = tmp.name[len(path.name) + 2 :].split(".", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def atomic_write(path, write: Callable[[str], None], what: str = "a file") -> Path:
    """Call ``write(temp_path)`` and rename the result onto ``path``."""
    with AtomicFile(path, what) as out:
        return out.commit(write)


def atomic_write_text(path, text: str, what: str = "a file") -> Path:
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"), what)


def read_named_rows(path) -> dict[str, dict]:
    """A JSON-lines cache of per-run entries (each with a ``name``), keyed by name; {} when there is no file. A line
    that is not a JSON object with a ``name`` is refused naming the file and the line (the caches are written whole
    and atomically)."""
    import json

    path = Path(path)
    if not path.is_file():
        return {}
    entries = {}
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                entry = None
            if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)):
                raise ConfigError(
                    f'{path}:{i} is not a JSON row (expected an object with a "name"; the file is written '
                    "atomically: was it edited?)"
                )
            entries[entry["name"]] = entry
    return entries


def write_rows(path, entries, what: str) -> Path:
    """Write ``entries`` as JSON lines, atomically (the counterpart of :func:`read_named_rows`)."""
    import json

    return atomic_write_text(path, "".join(json.dumps(e) + "\n" for e in entries), what)
