"""A run's aggregates that its other stored documents cannot give back, stored once per run.

Most of what a run measured can be recomputed from its request records and
decisions (the dashboard does). Two things cannot: LYREO's balance metrics
need the emulator's KV memory-time reading at every slot boundary, which no
document holds, and an emulated run's request-level routing windows are
routed inside the emulator, where storing an audit per window would grow
with the run's windows (one a second). So an emulated run stores
`RunTotals` when it ends: one bounded document whatever the run's length.

On a cluster the gateways store every window as a `Decision` with its
`WindowAudit`; `lmedge.metrics.window_totals` folds those into the same
`WindowTotals`, so both kinds of run read the same.

Not here: the per-request figures (TTFT, TPOT, end-to-end latency), which
the request records hold.
"""

from __future__ import annotations

from pydantic import Field

from lmedge.api.base import WireModel


class LoadBalanceStats(WireModel):
    """LYREO's balance metrics over a run's slots (`lmedge.metrics.load_balance_stats`)."""

    slots: int = Field(ge=0, description="Slots with a workload reading.")
    mean_deviation: float | None = Field(description="Mean over slots of mean_s Y_s.")
    mean_virtual_queue: float | None = Field(description="Mean over slots of mean_s Z_s.")
    high_kv_share: float | None = Field(description="Share of server-time at >= HIGH_KV.")


class WindowTotals(WireModel):
    """A run's request-level routing windows, summed.

    `windows` counts every window routed (by its router, its fallback or the
    slot's map); the terms are over the `reported` windows whose router
    reported them (CEMA's request mode and its baselines; a router that
    reports none, e.g. LYREO's, leaves them None): J, the load-aware seed's
    J on the same windows, the raw quality loss and the makespan are means
    per window, cost and energy totals of the router's model.
    """

    windows: int = Field(ge=0, description="Windows routed.")
    requests: int | None = Field(default=None, ge=0, description="Requests in them.")
    fallbacks: int | None = Field(
        default=None, ge=0, description="Windows not routed by the router (its fallback or map)."
    )
    decision_s_mean: float | None = Field(
        default=None, ge=0, description="Mean wall time to route a window, seconds."
    )
    reported: int = Field(default=0, ge=0, description="Windows whose router reported terms.")
    j_mean: float | None = None
    seed_j_mean: float | None = None
    quality_loss_mean: float | None = None
    cost: float | None = Field(default=None, description="Modelled cost, summed.")
    energy_j: float | None = Field(default=None, description="Modelled energy, J, summed.")
    makespan_s_mean: float | None = None


class RunTotals(WireModel):
    """One run's stored aggregates (see the module docstring); one document per run."""

    run: str = Field(min_length=1)
    slots: int = Field(ge=0, description="Measured slots.")
    balance: LoadBalanceStats | None = Field(
        default=None, description="Over the measured slots; None: no token engine ran."
    )
    windows: WindowTotals | None = Field(
        default=None, description="None: the run routed no request-level window."
    )
