"""The planner beside the slot loop: one plan in flight at most, applied at a slot start.

`ControlLoop` takes the planning observation in the loop (so the planner's
thread reads no loop state) and hands the guarded call to a `PlannerThread`.
The router and deployers keep using the previous macro policy until the new
one is done; it applies from the next slot start after that, or, with
`lag` (the loop's `plan_lag_slots`), exactly `lag` slots after its boundary,
waiting for it then if need be, so a run on virtual time stays
deterministic. A boundary or cluster change while a plan is in flight is
remembered and planned as soon as that one is done, with the newest
observation. Feedback for the planner waits while it plans, so a learning
planner is never called from two threads.

Also the bound on the episodic memory the planner is shown (`memory_cases`).
What the loop does with the plan (its `_macro`) and how the planner is
guarded stay with the loop and `guard.py`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from lmedge.api import (
    Decision,
    FeedbackConsumer,
    MacroPolicy,
    MemoryCase,
    PlanningObservation,
    RequestRecord,
)
from lmedge.api.live import REPLAN_KINDS, ContextUpdate

log = logging.getLogger(__name__)

#: Memory cases handed to the planner, best objective first. The planner picks
#: its own cases from them (best, worst, most similar traffic), so it needs the
#: whole range, not a top few; the bound only keeps observations small on very
#: long runs (an epoch is 25 minutes at nominal slots: 200 cases is 3.5 days).
MEMORY_CASES = 200

#: The guarded planner call: (observation, slot, trigger) -> its decision.
PlanCall = Callable[[PlanningObservation, int, "str | None"], Decision[MacroPolicy]]


class PlannerThread:
    """The planner's own thread and the one plan it may have in flight."""

    def __init__(
        self,
        planner: object,
        plan: PlanCall,
        observe: Callable[[int], PlanningObservation],
        lag: int | None,
    ) -> None:
        self._planner = planner
        self._plan = plan
        self._observe = observe  # epoch -> the planning observation, taken in the loop
        self._plan_lag = lag
        self._planner_pool: ThreadPoolExecutor | None = ThreadPoolExecutor(1, "planner")
        self._pending_plan: Future[Decision[MacroPolicy]] | None = None
        self._pending_apply_at: int | None = None
        self._replan_wanted: str | None = None
        self._planner_feedback: list[RequestRecord] = []

    @property
    def planning(self) -> bool:
        """A plan is in flight (feedback for the planner must wait)."""
        return self._pending_plan is not None

    def defer_feedback(self, records: list[RequestRecord]) -> None:
        """Keep `records` for the planner until the plan in flight is done."""
        self._planner_feedback.extend(records)

    def submit(self, epoch: int, slot: int, trigger: str | None) -> None:
        """Start planning in the planner thread; one plan in flight at most.

        A boundary or change while a plan is in flight is remembered and
        planned as soon as that one is done (with the newest observation).
        """
        if self._planner_pool is None:
            return
        if self._pending_plan is not None:
            self._replan_wanted = trigger or self._replan_wanted or "epoch boundary"
            return
        obs = self._observe(epoch)
        self._pending_plan = self._planner_pool.submit(self._plan, obs, slot, trigger)
        self._pending_apply_at = None if self._plan_lag is None else slot + self._plan_lag

    def collect(self, slot: int) -> Decision[MacroPolicy] | None:
        """The plan that takes effect at this slot start, if one does.

        Without a lag: the plan in flight if it is done (never waiting). With
        `plan_lag_slots`: the plan exactly at its slot, waiting for it then.
        Once the loop has applied it, `applied` goes on.
        """
        pending = self._pending_plan
        if pending is None:
            return None
        if self._pending_apply_at is not None:
            if slot < self._pending_apply_at:
                return None
        elif not pending.done():
            return None
        d = pending.result()  # the guard never raises: a failed planner is a fallback
        self._pending_plan, self._pending_apply_at = None, None
        return d

    def applied(self, epoch: int, slot: int) -> None:
        """After a collected plan is in force: the feedback that waited, then any re-plan."""
        if self._planner_feedback:
            feedback, self._planner_feedback = self._planner_feedback, []
            if isinstance(self._planner, FeedbackConsumer):
                observe(self._planner, feedback)
        if self._replan_wanted is not None:
            why, self._replan_wanted = self._replan_wanted, None
            self.submit(epoch, slot, why)

    def close(self) -> Decision[MacroPolicy] | None:
        """Stop the thread; the plan that was in flight, if it finished, to be recorded.

        Safe to call more than once. A plan still in flight is awaited (its
        call is bounded by the planner's own budget), never applied.
        """
        if self._planner_pool is not None:
            self._planner_pool.shutdown(wait=True)
            self._planner_pool = None
        pending, self._pending_plan = self._pending_plan, None
        if pending is not None and pending.done() and not pending.cancelled():
            return pending.result()  # the guard never raises
        return None


def memory_cases(memory: list[MemoryCase]) -> list[MemoryCase]:
    """Remembered epochs, lowest objective first (unknown last), at most `MEMORY_CASES`.

    Past the bound the middle of the ranking is dropped, so the best and
    the worst epochs always stay visible to the planner.
    """
    ranked = sorted(
        memory,
        key=lambda c: (c.objective is None, c.objective or 0.0, c.run, c.epoch),
    )
    if len(ranked) <= MEMORY_CASES:
        return ranked
    half = MEMORY_CASES // 2
    return ranked[:half] + ranked[-(MEMORY_CASES - half) :]


def replan_reason(update: ContextUpdate) -> str:
    """The changes that call for a re-plan, in words (the planner decision's `trigger`)."""
    parts = [
        f"{c.kind} {c.name}" + (f": {c.detail}" if c.detail else "")
        for c in update.changes
        if c.kind in REPLAN_KINDS
    ]
    return "cluster changed: " + "; ".join(parts)


def observe(plugin: FeedbackConsumer, records: list[RequestRecord]) -> None:
    """Hand finished requests to a learning plugin; its failure is logged, never raised."""
    # Feedback is advisory: a learning plugin that fails to learn still serves.
    try:
        plugin.observe(records)
    except Exception:
        log.exception("feedback to %s failed", getattr(plugin, "name", type(plugin).__name__))
