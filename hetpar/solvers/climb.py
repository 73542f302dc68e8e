"""Best-improvement hill climbing over pipeline structures: the one climb loop.

Two searches climb over structures (a plan's stages without its layer split and inner
choices), each completing a structure by the exact layer-split search: the exact
search's warm-start ``dive`` (``exact.py``: split and merge moves, to find a first
incumbent) and the policy planner's ``improve_structure`` (``local_search.py``: global
moves, single edits and a look two edits away). They differ in their moves and in how a
structure is completed and charged; the climb itself is this module's.

A climb's ``score(structure, to_beat)`` returns ``(value, payload)``: the value of the
best completion it found below ``to_beat`` (infinity when none) and whatever the caller
keeps with it (the plan). Scores may raise to end the climb; the exception passes
through.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable
from typing import Any, TypeVar

__all__ = ["Score", "best_move", "climb"]

S = TypeVar("S", bound=Hashable)
Score = Callable[[S, float], tuple[float, Any]]


def best_move(candidates: Iterable[S], score: Score[S], target: float, *,
              spent: Callable[[], bool] | None = None, tried: set[S] | None = None,
              ) -> tuple[S, float, Any] | None:
    """The candidate of lowest value below ``target`` (the first of equals), with its
    value and payload; None when none is below. Each candidate is scored against the best
    value so far, so a completion search only looks for better ones. ``spent``: asked
    before each candidate; True ends the scan with what it found. ``tried``: candidates
    scored before are skipped and each scored now is added (a climb's targets only fall,
    so a candidate that did not beat one cannot beat a later one)."""
    found: tuple[S, float, Any] | None = None
    for cand in candidates:
        if spent is not None and spent():
            break
        if tried is not None:
            if cand in tried:
                continue
            tried.add(cand)
        bar = target if found is None else found[1]
        value, payload = score(cand, bar)
        if value < bar:
            found = (cand, value, payload)
    return found


def climb(start: S, value: float, payload: Any, moves: Callable[[S], Iterable[S]],
          score: Score[S], *, beat: float = math.inf, spent: Callable[[], bool] | None = None,
          tried: set[S] | None = None, lookahead: Callable[[S], Iterable[S]] | None = None,
          ) -> tuple[S, float, Any, int]:
    """Move from ``start`` (of ``value``, with ``payload``) to the best of ``moves`` of
    the current structure that scores below both its value and ``beat``, while one does
    (or until ``spent``). With ``lookahead``, a local optimum is left for the best move
    of the first structure of ``lookahead(current)`` that has one below (two edits away:
    some edits pay only together). Returns the last structure, its value, its payload and
    the moves taken; ``spent`` and ``tried`` as in ``best_move``."""
    current, taken = start, 0
    while spent is None or not spent():
        found = best_move(moves(current), score, min(value, beat), spent=spent, tried=tried)
        if found is None and lookahead is not None:
            # A list: the look-ahead's structures are fixed before any of them is scored.
            for mid in list(lookahead(current)):
                if spent is not None and spent():
                    break
                found = best_move(moves(mid), score, min(value, beat), spent=spent,
                                  tried=tried)
                if found is not None:
                    break
        if found is None:
            break
        current, value, payload = found
        taken += 1
    return current, value, payload, taken
