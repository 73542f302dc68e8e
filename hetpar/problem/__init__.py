"""The problem being planned, owned in one place below both the solvers and the env.

* ``Instance`` (``instance.py``): a cluster, a model and a training spec as plain data;
* ``PlanSpace`` (``space.py``): the plans every planner searches;
* ``Problem`` (``problem.py``): an instance with its objective and bandwidth draws, and
  ``Problem.value(plan)``, the only way a plan is scored;
* ``Solution`` (``solution.py``): what every planner returns;
* ``generator.py``: the topology suites, seeded families of instances.
"""

from hetpar.costmodel.objective import Objective
from hetpar.problem.instance import Instance
from hetpar.problem.problem import DEFAULT_SAMPLES, DEFAULT_SEED, POLICY_SAMPLES, Problem
from hetpar.problem.solution import Certificate, Solution
from hetpar.problem.space import PlanSpace, StageChoice, SymmetryCheck

__all__ = ["Certificate", "DEFAULT_SAMPLES", "DEFAULT_SEED", "Instance", "Objective",
           "POLICY_SAMPLES", "PlanSpace", "Problem", "Solution", "StageChoice", "SymmetryCheck"]
