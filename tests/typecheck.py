"""The runtime type checker the test run applies to our packages (``--jaxtyping-packages`` in pyproject.toml):
beartype, with PEP 484's numeric tower (an ``int`` is a valid ``float``, as type checkers read annotations)."""

from beartype import BeartypeConf, beartype

checker = beartype(conf=BeartypeConf(is_pep484_tower=True))
