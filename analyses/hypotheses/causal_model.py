"""Causal models: the algorithm a researcher believes a network runs, written as named high-level variables.

A causal model in the sense of Geiger et al. 2021 (*Causal Abstractions of Neural Networks*) is a directed acyclic
graph of variables, each a function of its parents; the roots read the input. Here the input is a batch of
:class:`interp.task.TaskData`: a variable's function takes tensors over the batch, named after the task's per-example
fields (``data.fields``: ``n0``, ``a``, ``answer``, ...), the data's own tensors (``tokens``, ``labels``,
``answer_pos``, ``lengths``, ``targets``) or other variables. One variable is the **output**: the token id the
network should predict at the **readout** position (by default each example's answer position). For noisy majority::

    CausalModel(
        {"diff": lambda n0, n1: n0 - n1, "answer": lambda diff: torch.where(diff >= 0, FOUR, FIVE)},
        output="answer",
    )

A variable's parents are the names of its function's parameters (or ``Variable(fn, parents=(...))``); a parameter
named like the variable itself reads the data (``"a": lambda a: a`` is the operand ``a`` as a variable). An
**intervention** fixes a variable to given values and recomputes what depends on it; an **interchange** sets a
variable of the *base* input to the value it takes on a *source* input, and the output then is the counterfactual
output an aligned network should give when its aligned site is patched from the source run (Geiger et al. 2021;
Geiger et al. 2024, *Finding Alignments Between Interpretable Causal Variables and Distributed Neural
Representations*).

A **positional** variable (``Variable(fn, positional=True)``) has one value per token position, ``[batch, pos]`` (the
token before each position, ...): it is interchanged at the positions an alignment patches, base position ``j`` taking
the source's value at source position ``j``.

Named positions (``positions={"key": fn}``, ``fn(data) -> [batch]`` or ``[batch, m]``) let sites and the readout
name the task's own places (where digit ``k`` of the answer is predicted, ...).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from interp.errors import ConfigError, TaskError
from interp.task import TaskData

DATA_INPUTS = ("tokens", "labels", "answer_pos", "lengths", "targets")
Positions = int | str | Callable[[TaskData], Tensor] | None


@dataclass(frozen=True)
class Variable:
    """One high-level variable: ``fn(*parents) -> Tensor [batch]`` (``[batch, pos]`` where ``positional``).
    ``parents`` default to the names of ``fn``'s parameters: other variables, the data's fields, or ``tokens``,
    ``labels``, ``answer_pos``, ``lengths``, ``targets``."""

    fn: Callable[..., Tensor]
    parents: tuple[str, ...] | None = None
    positional: bool = False
    about: str = ""

    def parent_names(self, name: str) -> tuple[str, ...]:
        if self.parents is not None:
            return tuple(self.parents)
        try:
            params = inspect.signature(self.fn).parameters.values()
        except (TypeError, ValueError):
            raise ConfigError(
                f"cannot read the parameters of variable {name!r}'s function; give them as Variable(fn, parents=...)"
            ) from None
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            raise ConfigError(f"variable {name!r} takes *args or **kwargs; name its parents: Variable(fn, parents=...)")
        return tuple(p.name for p in params)


class CausalModel:
    """Named high-level variables over task data, one of them the output (see the module's docstring).

    ``variables`` maps names to functions or :class:`Variable`; ``output`` names the variable whose value (a token id
    per example) the network should predict at ``readout`` (a position: ``"answer"``, a named position, an int, or
    a function of the data). ``positions`` names the task's places for sites and the readout."""

    def __init__(
        self,
        variables: Mapping[str, Callable[..., Tensor] | Variable],
        *,
        output: str,
        readout: Positions = "answer",
        positions: Mapping[str, Callable[[TaskData], Tensor]] | None = None,
        name: str = "",
        about: str = "",
    ):
        if not variables:
            raise ConfigError("a causal model needs at least one variable")
        self.variables: dict[str, Variable] = {}
        for key, v in variables.items():
            if not isinstance(key, str) or not key.isidentifier():
                raise ConfigError(f"variable names must be Python identifiers, got {key!r}")
            if isinstance(v, Variable):
                self.variables[key] = v
            elif callable(v):
                self.variables[key] = Variable(v)
            else:
                raise ConfigError(f"variable {key!r} must be a function or a Variable, got {type(v).__name__}")
        if output not in self.variables:
            raise ConfigError(f"the output {output!r} is not one of the variables {list(self.variables)}")
        if self.variables[output].positional:
            raise ConfigError(f"the output {output!r} must have one value per example, not one per position")
        self.output = output
        self.readout = readout
        self.positions = dict(positions or {})
        self.name = name
        self.about = about
        self.parents = {k: v.parent_names(k) for k, v in self.variables.items()}
        self.order = self._topological_order()
        self.inputs = tuple(
            sorted({p for k, ps in self.parents.items() for p in ps if p not in self.variables or p == k})
        )

    def _topological_order(self) -> list[str]:
        order: list[str] = []
        state: dict[str, int] = {}

        def visit(name: str, path: tuple[str, ...]) -> None:
            if state.get(name) == 2:
                return
            if state.get(name) == 1:
                raise ConfigError(f"the causal model has a cycle: {' -> '.join((*path, name))}")
            state[name] = 1
            for p in self.parents[name]:
                if p in self.variables and p != name:
                    visit(p, (*path, name))
            state[name] = 2
            order.append(name)

        for name in self.variables:
            visit(name, ())
        return order

    def __repr__(self) -> str:
        return f"CausalModel({self.describe()})"

    def describe(self) -> str:
        """One line: each variable with its parents, the output and the readout."""
        parts = [f"{k}({', '.join(self.parents[k])})" for k in self.order]
        readout = self.readout if isinstance(self.readout, (str, int)) else "custom"
        return f"{'; '.join(parts)} -> output {self.output} at {readout}"

    def downstream(self, variable: str) -> set[str]:
        """The variables that depend on ``variable`` (itself included)."""
        out = {variable}
        for k in self.order:
            if any(p in out and p != k for p in self.parents[k]):
                out.add(k)
        return out

    def check_variable(self, variable: str) -> Variable:
        if variable not in self.variables:
            raise ConfigError(f"unknown variable {variable!r}; this causal model has {list(self.variables)}")
        if self.output not in self.downstream(variable):
            raise ConfigError(
                f"the output {self.output!r} does not depend on {variable!r}: interchanging it cannot change the answer"
            )
        return self.variables[variable]

    def _input(self, data: TaskData, name: str) -> Tensor:
        if name in data.fields:
            return data.fields[name]
        if name in DATA_INPUTS:
            return getattr(data, name)
        raise TaskError(
            f"the causal model reads {name!r}, which the data lacks; the data has the fields {sorted(data.fields)} "
            f"and {list(DATA_INPUTS)}"
        )

    def values(self, data: TaskData, interventions: Mapping[str, Tensor] | None = None) -> dict[str, Tensor]:
        """Every variable's value on ``data`` (``[batch]``, or ``[batch, pos]`` for positional ones), with the
        variables in ``interventions`` fixed to the given values (what depends on them is recomputed)."""
        interventions = dict(interventions or {})
        unknown = set(interventions) - set(self.variables)
        if unknown:
            raise ConfigError(f"cannot intervene on {sorted(unknown)}: not variables of {list(self.variables)}")
        env: dict[str, Any] = {}
        for k in self.order:
            if k in interventions:
                env[k] = torch.as_tensor(interventions[k], device=data.device)
                continue
            args = [
                env[p] if p in self.variables and p != k else self._input(data, p).to(data.device)
                for p in self.parents[k]
            ]
            try:
                value = self.variables[k].fn(*args)
            except Exception as e:  # a user's function failed: name the variable, keep the cause
                raise ConfigError(f"variable {k!r} of the causal model failed on the data: {e}") from e
            env[k] = torch.as_tensor(value, device=data.device)
        b = len(data)
        for k, v in env.items():
            want = 2 if self.variables[k].positional else 1
            if v.dim() != want or v.shape[0] != b:
                kind = "[batch, pos]" if want == 2 else "[batch]"
                raise ConfigError(
                    f"variable {k!r} gave a value of shape {tuple(v.shape)}; expected {kind} ({b} examples)"
                )
        out = env[self.output]
        if out.dtype in (torch.float16, torch.float32, torch.float64, torch.bfloat16, torch.bool):
            raise ConfigError(f"the output {self.output!r} must be integer token ids, got dtype {out.dtype}")
        return env

    def output_of(self, data: TaskData, interventions: Mapping[str, Tensor] | None = None) -> Int[Tensor, " batch"]:
        """The output (token ids) on ``data`` under ``interventions``."""
        return self.values(data, interventions)[self.output].long()

    def interchange(
        self,
        base: TaskData,
        source: TaskData,
        variable: str,
        base_positions: Int[Tensor, "batch m"] | None = None,
        source_positions: Int[Tensor, "batch m"] | None = None,
    ) -> Int[Tensor, " batch"]:
        """The counterfactual output of each base example when ``variable`` takes the value it has on the source
        example of the same row (a positional variable: at ``base_positions``, from ``source_positions``)."""
        var = self.check_variable(variable)
        if len(base) != len(source):
            raise ConfigError(f"base and source must pair row by row: {len(base)} and {len(source)} examples")
        src = self.values(source)[variable]
        if var.positional:
            if base_positions is None or source_positions is None:
                raise ConfigError(f"variable {variable!r} is positional: give the positions it is interchanged at")
            value = self.values(base)[variable].clone()
            rows = torch.arange(len(base), device=value.device)[:, None]
            value[rows, base_positions.to(value.device)] = src[rows, source_positions.to(src.device)].to(value.dtype)
        else:
            value = src
        return self.output_of(base, {variable: value})
