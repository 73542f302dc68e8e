"""What ``--json`` prints: the same bytes on every run with the same inputs and seed.

Wall-clock measurements (how long a search, a rollout or the whole command took) differ
from run to run, so ``hetpar estimate``, ``solve``, ``plan`` and ``evaluate`` leave them
out of ``--json`` unless ``--timings`` is given: the keys in ``TIMING_KEYS``
(``hetpar.problem.solution.without_timings``, beside ``Solution.to_dict``), wherever they
occur (a ``Solution``'s ``wall_s`` and ``timings_s``, its certificate's ``wall_s``,
``plan --compare``'s result, every ``evaluate`` row). ``hetpar replan --json`` leaves out
the measured planning seconds (``hetpar.dynamics.experiment.MEASURED_KEYS``; its
``wall_s`` is the simulated job's, a result). Everything else is a function of the
inputs, the seed and the step or node budgets, but for what the command help and
docs/solvers.md state: an exact search stopped by ``--time-limit`` (where it stopped
depends on the machine's speed and load), ``--workers`` above 1 (which worker reports a
tied plan first credits ``found_by``, and the node counts depend on the interleaving),
and replan's ``policy`` and ``exact-rt`` strategies charge their measured planning time
to the simulated run.
"""

from __future__ import annotations

__all__ = ["TIMINGS_HELP"]

TIMINGS_HELP = ("with --json, also print the wall-clock seconds (wall_s, timings_s), which "
                "differ from run to run; without it the same inputs and seed print the same "
                "bytes")
