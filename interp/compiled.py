"""The one cache of compiled training steps (``torch.compile``).

A step function is compiled once per process for each ``dynamic`` setting and reused (a sweep trains many
populations in one process; each used to compile its step afresh). ``torch.compile`` on the CPU generates C++:
where no C++ compiler is installed, :func:`compiled_step` refuses in one line (``compile=True`` was asked for), and
:func:`compiled_or_plain` falls back to the plain function (an optional speed-up). The plain function is compiled
(``inspect.unwrap``): a runtime type checker's wrapper, as the test run puts on every function of the package, is
not traceable by every torch (the functions it calls are wrapped too; torch 2.13 traces those, 2.11 did not trace
the counter masks' hash, which is now ``no_type_check``).

Each compiled step specialises on its shapes (``dynamic=False``: one graph per population size, batch, d_model and
form), and a sweep or Table 1's regeneration trains several such shapes in one process (six graphs of the
token-count step for Table 1's three sizes). Torch keeps at most ``torch._dynamo.config.recompile_limit`` graphs
per function (8 by default) and past it runs the plain function for the rest of the process, with one logged
warning: the numbers stay right, the runs get slower without a word in the run record. :func:`_compiled` raises
that limit to at least :data:`RECOMPILE_LIMIT` (it never lowers a limit the user set).

A step compiled with ``dynamic=True`` whose widths change from step to step gets one graph for all of them only if
nothing else about its inputs changes. In the per-position step two things did, and each new combination compiled
a new graph (several seconds each; a 3-epoch population of two tiny models took 610 s against ~1 s eager): its
inputs are views cut out of a bigger batch (:func:`interp.position_forward.cut_rows`), whose strides and storage
offsets the graph guards on; and torch's "duck sizing" gives two sizes one symbol where they happen to be equal in
the first call (the width and ``K * n_heads``, say), so a later call where they differ recompiles. Such a step is
compiled with ``cut_views=True`` (:func:`_cut_views`): every tensor argument is passed contiguous at offset 0 and
the step compiles without duck sizing. The parameters go in as tensors of their own too
(clones: gradients flow back to the flat buffer). The prefix-count step, compiled without duck sizing and given the
population's parameters as views at their offsets in the flat buffer, computed wrong losses from the first step
(2.1217 where the eager step gives 2.0527) and NaN by the fourth (torch 2.13's CPU inductor); with the parameters
copied, or with duck sizing, it equals the eager step. It keeps duck sizing (its inputs keep their shapes anyway:
:func:`interp.population_paths.prefix_widths`).
"""

from __future__ import annotations

import functools
import inspect
import shutil
from collections.abc import Callable

import torch

from .errors import ConfigError

COMPILERS = ("g++", "c++", "clang++")
RECOMPILE_LIMIT = 64  # graphs per compiled function and process: room for every shape a sweep's cells bring


@functools.cache
def has_compiler() -> bool:
    """Whether a C++ compiler is on the PATH (what ``torch.compile`` needs on the CPU)."""
    return any(shutil.which(c) for c in COMPILERS)


@functools.cache
def _compiled(fn: Callable, dynamic: bool, cut_views: bool = False) -> Callable:
    import torch._dynamo  # compiling imports it anyway; importing interp need not

    cfg = torch._dynamo.config
    cfg.recompile_limit = max(cfg.recompile_limit, RECOMPILE_LIMIT)
    compiled = torch.compile(inspect.unwrap(fn), dynamic=dynamic)
    return _cut_views(compiled) if cut_views else compiled


def _own(x):
    """A tensor argument as a contiguous tensor at storage offset 0 (a graph guards on strides and offsets; one
    that already is one is passed as it is, not copied); anything else (numbers, strings, a norm) as it is."""
    if not isinstance(x, torch.Tensor) or (x.is_contiguous() and x.storage_offset() == 0):
        return x
    return x.clone(memory_format=torch.contiguous_format)


def _cut_views(compiled: Callable) -> Callable:
    """``compiled`` (a ``dynamic=True`` step) called with tensors contiguous at offset 0 (those of a dict argument
    too: a population's parameters are views into one flat buffer) and compiled without duck sizing: one graph for
    every width and place of the views a run cuts (module docstring)."""
    from torch.fx.experimental import _config as fx_config

    @functools.wraps(compiled)
    def step(*args, **kwargs):
        args = tuple({k: _own(v) for k, v in a.items()} if isinstance(a, dict) else _own(a) for a in args)
        with fx_config.patch(use_duck_shape=False):
            return compiled(*args, **{k: _own(v) for k, v in kwargs.items()})

    return step


def compiled_step(fn: Callable, *, dynamic: bool, device, cut_views: bool = False) -> Callable:
    """``torch.compile(fn, dynamic=dynamic)``, from the cache; a ConfigError where ``device`` is the CPU and no C++
    compiler is installed. ``cut_views=True`` (with ``dynamic=True``): the step's tensor arguments are views cut at
    changing places and sizes (module docstring)."""
    if torch.device(device).type == "cpu" and not has_compiler():
        raise ConfigError(
            "compile=True (--compile) needs a C++ compiler on the CPU (torch.compile generates C++); "
            "install g++ or train without it"
        )
    if cut_views and not dynamic:
        raise ValueError("cut_views=True is for steps compiled with dynamic=True")
    return _compiled(fn, dynamic, cut_views)


def compiled_or_plain(fn: Callable, *, dynamic: bool) -> Callable:
    """The compiled ``fn`` from the cache where a C++ compiler is installed, else the plain function."""
    return _compiled(fn, dynamic) if has_compiler() else inspect.unwrap(fn)
