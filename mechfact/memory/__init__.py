"""Linear associative memories (paper A): problems, solvers, analyses, experiments."""

from .problems import MemoryProblem, PROBLEMS
from .solvers import METHODS

__all__ = ["MemoryProblem", "PROBLEMS", "METHODS"]
