"""The test suite. A package so that its type checker (:mod:`tests.typecheck`) can be named in pytest's options."""

from . import typecheck as typecheck
