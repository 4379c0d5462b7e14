"""A stage's checks of its params against the inputs they name, run before the stage does any work.

Each module here serves one stage, which calls it first, and ``sparsefinder params``, which calls it too,
so that the command refuses a params file exactly when the stage would. A module has:

- ``check_params(section)``: what needs no input (known predictor names and knobs), always run;
- ``input_checks(section)``: the checks against input files or folders, in the stage's order, each an
  :class:`InputCheck` naming the keys it reads; ``sparsefinder params`` runs each one whose own inputs
  exist and says which wait for the rest;
- ``check_inputs(section)``: what the stage calls: every check in that order (a missing input is an error
  there), returning what the checks loaded, so that the stage reads nothing twice.

The project and cluster modules have one ``check_inputs``, offered to the command as one :class:`InputCheck`.
The package imports none of its modules, so a stage depends only on its own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Self


@dataclass(frozen=True)
class InputCheck:
    """One check against input files: ``inputs`` maps each dotted params key it reads to the path that key
    names; ``run`` raises :class:`~pipeline.errors.UserError` when the params do not fit those inputs."""

    inputs: dict[str, str]
    run: Callable[[], object]


class StageInputs(ABC):
    """A stage's inputs, each read once (as a ``cached_property``) when a check or the stage first asks
    for it, and its checks of params against them, in the stage's order."""

    @abstractmethod
    def checks(self) -> list[InputCheck]:
        """Every check, in the order the stage runs them."""

    def check(self) -> Self:
        """Run every check, a missing input being an error, as the stage does; the inputs, for the stage."""
        for check in self.checks():
            check.run()
        return self
