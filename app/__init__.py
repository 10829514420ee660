"""The app layer, the top floor: what wires the core (``interp``), the tasks (``interp.tasks``) and the analyses
(``interp.analyses``) together for a user: the command line (:mod:`interp.app.cli`), whole reports
(:mod:`interp.app.report`), sweep orchestration with its backends (:mod:`interp.app.sweeps`) and the Jupyter
explorer (:mod:`interp.app.explorer`). Nothing below imports it."""

__all__: list[str] = []
