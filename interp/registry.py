"""The task registry: every door (the command line, ``interp.load``, suites, reports, the explorer, sweep workers)
finds a task by its name here, and only here.

A task is registered in one of two ways, and the four shipped tasks use the first, exactly as a user's package does:

- an **entry point** in the group ``interp.tasks`` of an installed package (in its ``pyproject.toml``,
  ``[project.entry-points."interp.tasks"]`` with a line ``my-task = "my_package.my_task:PLUGIN"``), pointing at a
  :class:`TaskPlugin` or at a Task class. Entry points are read once per process (cached) with
  :func:`importlib.metadata.entry_points`, and one is imported only when its task is asked for; every process that
  can import the package sees it (the command line, Ray workers);
- :func:`register_task` in Python (a notebook): seen by this process only.

A :class:`TaskPlugin` names the task, how to build it (``make(**params)``, usually the task class), and optionally
its analysis suite (an :class:`interp.suite.Suite`, a zero-argument callable returning one, or a lazy
``"module:attr"`` reference imported only when the suite is asked for), a folder of ``.safetensors`` checkpoints
that ``interp.load(name)`` finds by file stem, and old checkpoint names still accepted. A checkpoint names its task
by its registered name; loading one never imports a module named in a file.

This module is the core's (floor 1): it names no task and imports no task, analysis or app module.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from .errors import TaskError
from .suite import Suite
from .task import Task

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

GROUP = "interp.tasks"  # the entry-point group of task plugins
HOWTO = (
    "register yours with interp.register_task(YourTask) in Python or an entry point in the group "
    f"'{GROUP}' of your package (docs/own-task.md)"
)


# a task's name: it becomes part of paths (sweep folders, checkpoint names) and of one-line messages, so no '/',
# '..' path, whitespace, newline or non-ASCII character
NAME_RULE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*", re.ASCII)


@dataclass(frozen=True)
class TaskPlugin:
    """A registered task: its ``name`` (what checkpoints, the command line and ``get_task`` call it), ``make``
    (``make(**params)`` builds the task; usually the task class itself), and optionally its analysis ``suite`` (an
    :class:`interp.suite.Suite`, a zero-argument callable returning one, or a lazy ``"module:attr"`` reference), a
    ``checkpoints`` folder of ``.safetensors`` files that ``interp.load(name)`` finds by file stem, and ``aliases``
    (old checkpoint names -> their names today)."""

    name: str
    make: Callable[..., Task]
    suite: Suite | Callable[[], Suite] | str | None = None
    checkpoints: Path | str | None = None
    aliases: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.name, str) or not NAME_RULE.fullmatch(self.name):
            raise TaskError(
                "a task's name is ASCII letters, digits, '-', '_' and '.', starting with a letter or digit (it names "
                f"files, folders and command-line arguments), got {self.name!r}"
            )
        if not callable(self.make):
            raise TaskError(f"task {self.name!r}: make must be a Task class or a factory, got {self.make!r}")
        suite = self.suite
        if not (suite is None or isinstance(suite, (Suite, str)) or callable(suite)):
            raise TaskError(
                f"task {self.name!r}: suite must be a Suite, a callable returning one or a 'module:attr' reference, "
                f"got {type(suite).__name__}"
            )
        if isinstance(suite, str) and ":" not in suite:
            raise TaskError(f"task {self.name!r}: a suite reference is 'module:attr', got {suite!r}")
        if self.checkpoints is not None:
            object.__setattr__(self, "checkpoints", Path(self.checkpoints))
        aliases = dict(self.aliases)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in aliases.items()):
            raise TaskError(f"task {self.name!r}: aliases map old checkpoint names to names (strings)")
        object.__setattr__(self, "aliases", MappingProxyType(aliases))


# -- the registry's state ------------------------------------------------------------------------------------------

_registered: dict[str, tuple[TaskPlugin, str]] = {}  # name -> (plugin, where it was registered), from Python
_loaded: dict[str, TaskPlugin] = {}  # name -> plugin, entry points loaded so far
_suites: dict[str, Suite | None] = {}  # name -> its resolved suite
_entry_points: dict[str, list[EntryPoint]] = {}  # name -> its entry points (one, unless in conflict), once read
_read: list[bool] = []  # [True] once the entry points were read


def _entry_point_table() -> dict[str, list[EntryPoint]]:
    """The entry points of the group, read once per process: name -> entry points (the same name and value seen
    twice, e.g. an editable install's metadata found on two paths, counts once)."""
    if not _read:
        from importlib.metadata import entry_points

        for ep in entry_points(group=GROUP):
            same = _entry_points.setdefault(ep.name, [])
            if all(other.value != ep.value for other in same):
                same.append(ep)
        _read.append(True)
    return _entry_points


def forget_entry_points() -> None:
    """Read the entry points again on next use (after installing a plugin package into a running process)."""
    _entry_points.clear()
    _read.clear()
    _loaded.clear()
    _suites.clear()


def _distribution(ep: EntryPoint) -> str:
    dist = ep.dist
    return "an unknown distribution" if dist is None else f"{dist.name} {dist.version}"


def _describe(ep: EntryPoint) -> str:
    return f"the entry point '{ep.name} = {ep.value}' of {_distribution(ep)} (group '{GROUP}')"


def _plugin_of(obj: object, name: str, where: str) -> TaskPlugin:
    """``obj`` (a TaskPlugin, or a Task class / factory) as the TaskPlugin of ``name``."""
    if isinstance(obj, TaskPlugin):
        if obj.name != name:
            raise TaskError(f"{where} registers the name {name!r} but its TaskPlugin is named {obj.name!r}")
        return obj
    if isinstance(obj, type) or callable(obj):
        return TaskPlugin(name=name, make=obj)
    raise TaskError(f"{where} loads to a {type(obj).__name__}; expected a TaskPlugin or a Task class")


def _load_entry_point(name: str) -> TaskPlugin | None:
    """The plugin of the entry point ``name`` (loaded once), or None where no entry point has that name; a broken
    entry point is one TaskError naming its distribution and value."""
    if name in _loaded:
        return _loaded[name]
    eps = _entry_point_table().get(name)
    if not eps:
        return None
    if len(eps) > 1:
        raise TaskError(
            f"task {name!r} is registered by more than one entry point: " + "; ".join(_describe(ep) for ep in eps)
        )
    ep = eps[0]
    try:
        obj = ep.load()
    except Exception as e:
        raise TaskError(f"{_describe(ep)} cannot be loaded: {type(e).__name__}: {e}") from e
    _loaded[name] = _plugin_of(obj, name, _describe(ep))
    return _loaded[name]


def _same_task(a: TaskPlugin, b: TaskPlugin) -> bool:
    """Whether two plugins build the same task: the same ``make``, or one defined again under the same module and
    name (a notebook cell run twice defines a new class of the same name)."""
    if a.make is b.make:
        return True
    key = [(getattr(p.make, "__module__", None), getattr(p.make, "__qualname__", None)) for p in (a, b)]
    return key[0] == key[1] and key[0][1] is not None


# -- registering and finding tasks -------------------------------------------------------------------------------


def register_task(
    task_or_plugin: TaskPlugin | type | Callable[..., Task],
    *,
    name: str | None = None,
    suite: Suite | Callable[[], Suite] | str | None = None,
    checkpoints: Path | str | None = None,
    replace: bool = False,
) -> TaskPlugin:
    """Register a task in this process: a Task class (its ``name`` attribute names it, or ``name=``), a factory
    ``make(**params) -> Task`` (with ``name=``), or a :class:`TaskPlugin`; ``suite`` and ``checkpoints`` as on
    :class:`TaskPlugin`. Registering the same task again updates it; a different task under a name already taken
    (by another registration or an entry point) is a TaskError unless ``replace=True``. Returns the plugin.

    A task registered here is seen by this process only: for the command line in another process, or Ray workers,
    register it by an entry point (``docs/own-task.md``)."""
    if isinstance(task_or_plugin, TaskPlugin):
        changes = {k: v for k, v in (("name", name), ("suite", suite), ("checkpoints", checkpoints)) if v is not None}
        plugin = _replace(task_or_plugin, changes)
    else:
        if not callable(task_or_plugin):
            raise TaskError(
                f"register_task takes a Task class, a factory or a TaskPlugin, got {type(task_or_plugin).__name__}"
            )
        if name is None:
            name = getattr(task_or_plugin, "name", None) if isinstance(task_or_plugin, type) else None
            if not isinstance(name, str):
                raise TaskError(
                    f"{getattr(task_or_plugin, '__name__', task_or_plugin)!r} has no class attribute 'name': give "
                    "register_task(..., name='my-task')"
                )
        plugin = TaskPlugin(name=name, make=task_or_plugin, suite=suite, checkpoints=checkpoints)
    where = f"interp.register_task in {_caller()}"
    old = _registered.get(plugin.name)
    if old is not None:
        taken, taken_where = old
    else:
        taken, taken_where = _load_entry_point(plugin.name), None
        if taken is not None:
            taken_where = _describe(_entry_point_table()[plugin.name][0])
    if taken is not None and not replace and not _same_task(taken, plugin):
        raise TaskError(
            f"task name {plugin.name!r} is taken by {taken_where} ({_made_by(taken)}); give another name, or "
            "register_task(..., replace=True) to replace it in this process"
        )
    _registered[plugin.name] = (plugin, where)
    _suites.pop(plugin.name, None)
    return plugin


def _caller() -> str:
    """The module that called :func:`register_task` (past this module and runtime type checkers' wrappers)."""
    import inspect

    frame = inspect.currentframe()
    while frame is not None:
        name = frame.f_globals.get("__name__", "?")
        if not name.startswith((__name__, "jaxtyping", "beartype", "typeguard")):
            return name
        frame = frame.f_back
    return "?"


def _replace(plugin: TaskPlugin, changes: dict[str, Any]) -> TaskPlugin:
    return replace(plugin, **changes) if changes else plugin


def _made_by(plugin: TaskPlugin) -> str:
    make = plugin.make
    return f"{getattr(make, '__module__', '?')}.{getattr(make, '__qualname__', repr(make))}"


def unregister_task(name: str) -> None:
    """Forget a task registered in this process with :func:`register_task` (entry points stay)."""
    if name not in _registered:
        raise TaskError(f"task {name!r} was not registered in this process with interp.register_task")
    del _registered[name]
    _suites.pop(name, None)


def task_names() -> list[str]:
    """Every registered task's name (entry points and :func:`register_task`), sorted; no plugin is imported."""
    return sorted({*_entry_point_table(), *_registered})


def unknown_task(name: object) -> TaskError:
    """The one-line error of a name no task is registered under."""
    return TaskError(f"unknown task {name!r}; registered tasks: {', '.join(task_names()) or 'none'}; {HOWTO}")


def task_plugin(name: str) -> TaskPlugin:
    """The :class:`TaskPlugin` registered under ``name`` (a registration in this process first, then an entry
    point), or the one-line TaskError saying how to register it."""
    if not isinstance(name, str):
        raise TaskError(f"a task name must be a string, got {type(name).__name__}")
    if name in _registered:
        return _registered[name][0]
    plugin = _load_entry_point(name)
    if plugin is None:
        raise unknown_task(name)
    return plugin


def task_source(name: str) -> str:
    """Where the task ``name`` is registered, in words (``interp list``): its entry point and distribution, or the
    module that called :func:`register_task`."""
    if name in _registered:
        return _registered[name][1]
    eps = _entry_point_table().get(name)
    if not eps:
        raise unknown_task(name)
    return "; ".join(f"entry point {ep.value} of {_distribution(ep)}" for ep in eps)


def entry_point_only(name: str) -> bool:
    """Whether every process that imports the installed packages finds the task ``name`` (an entry point, not
    replaced by a registration in this process): what a Ray worker can rebuild."""
    return name not in _registered and bool(_entry_point_table().get(name))


TASK_MEMBERS = tuple(sorted({*Task.__annotations__, *(k for k in vars(Task) if not k.startswith("_"))}))


def get_task(name: str, **params: Any) -> Task:
    """Build the registered task ``name`` with ``params`` (e.g. ``get_task("noisy-majority", test_size=200)``); a
    TaskError for an unknown name, parameters the task refuses, or an object that is not a Task of that name."""
    plugin = task_plugin(name)
    valid = task_parameters(plugin.make)
    unknown = [k for k in params if valid is not None and k not in valid]
    if unknown:
        raise TaskError(
            f"task {name!r} has no parameter{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; its "
            f"parameters are {', '.join(valid) or 'none'}"
        )
    try:
        task = plugin.make(**params)
    except TypeError as e:
        hint = f" (its parameters: {', '.join(valid)})" if valid else ""
        raise TaskError(f"bad parameters for task {name!r}{hint}: {e}") from None
    check_task_object(task, name)
    return task


def task_parameters(make: Callable[..., Any]) -> list[str] | None:
    """The keyword parameters ``make`` (a task class or factory) takes, in order, or None where it takes any
    (``**kwargs``) or its signature cannot be read."""
    import inspect

    try:
        sig = inspect.signature(make)
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return None
    return [n for n, p in sig.parameters.items() if p.kind in kinds]


def check_task_object(task: object, name: str | None = None) -> None:
    """A TaskError naming what is missing where ``task`` does not implement :class:`interp.task.Task` (or is named
    other than ``name``, the name it is registered under)."""
    missing = [m for m in TASK_MEMBERS if m not in dir(task)]
    if missing:
        raise TaskError(
            f"{type(task).__name__} does not implement the Task protocol (interp.task.Task): it lacks "
            f"{', '.join(missing)} (docs/own-task.md)"
        )
    if name is not None and task.name != name:
        raise TaskError(
            f"the task registered as {name!r} builds a task named {task.name!r}: a checkpoint records task.name, "
            "so the two must agree"
        )


def suite_of(task_or_name: Task | str) -> Suite | None:
    """The analysis suite registered with a task (resolved once: a lazy ``"module:attr"`` is imported now), or None
    where the task registered none, or where ``task_or_name`` is a task object whose name is not registered (a
    task built by hand). An unregistered name (a string) is the one-line TaskError."""
    name = task_or_name if isinstance(task_or_name, str) else task_or_name.name
    if name in _suites:
        return _suites[name]
    if not isinstance(task_or_name, str) and name not in task_names():
        return None
    plugin = task_plugin(name)
    suite = plugin.suite
    if isinstance(suite, str):
        module, _, attr = suite.partition(":")
        try:
            suite = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise TaskError(f"the suite {plugin.suite!r} of task {name!r} cannot be loaded: {e}") from e
    if suite is not None and not isinstance(suite, Suite) and callable(suite):
        suite = suite()
    if suite is not None and not isinstance(suite, Suite):
        raise TaskError(
            f"the suite of task {name!r} is a {type(suite).__name__}, not an interp.suite.Suite (analyze, "
            "add_report_sections, add_sweep_sections, finish_run, the explorer's hooks and hypotheses)"
        )
    _suites[name] = suite
    return suite


def plugins(*, broken: list[str] | None = None) -> list[TaskPlugin]:
    """Every registered task's plugin, by name (each entry point is imported). A plugin that cannot be loaded is a
    TaskError, or, given a list ``broken``, its one-line error is appended there and the others are returned."""
    out = []
    for name in task_names():
        try:
            out.append(task_plugin(name))
        except TaskError as e:
            if broken is None:
                raise
            broken.append(str(e))
    return out
