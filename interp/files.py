"""Writing output files atomically: a temp file in the target folder, then a rename.

Readers never see a half-written file, and a failure leaves nothing behind. :class:`AtomicFile` reserves
the temp file when it is created, so an unwritable path fails before any expensive work. Temp files are named
``.NAME.PID.XXXX.tmp``; one left by a process that was killed (``kill -9``) is removed the next time that output
is written (only when its process is gone: a concurrent writer's file is left alone).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from .errors import ConfigError, InterpError


class AtomicFile:
    """An output path checked and reserved up front; :meth:`commit` fills it and renames it into place.
    Used as a context manager, the temp file is removed if nothing was committed."""

    def __init__(self, path, what: str = "a file"):
        self.path = Path(path)
        self.what = what
        parent = self.path.parent if str(self.path.parent) else Path(".")
        if self.path.is_dir():
            self._fail("it is a directory; expected a file path")
        if not parent.exists():
            self._fail(f"directory {parent} does not exist")
        if not parent.is_dir():
            self._fail(f"{parent} is not a directory")
        remove_stale_temps(self.path)
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.{os.getpid()}.", suffix=".tmp", dir=parent)
        except OSError as e:
            self._fail(f"{e.strerror or e} in {parent}")
        os.close(fd)
        self.tmp: Path | None = Path(tmp)

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
            os.replace(self.tmp, self.path)
        except OSError as e:
            self._fail(e.strerror or str(e))
        finally:
            self.discard()
        return self.path

    def discard(self) -> None:
        if self.tmp is not None:
            self.tmp.unlink(missing_ok=True)
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
