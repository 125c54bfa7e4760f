"""A slot of examples/lyreo as a request-level router sees it: one routing window."""

from __future__ import annotations

from pathlib import Path

from lmedge.api import RequestWindow, SlotObservation, WindowRequest
from lmedge.backends.emulated import EmulatedBackend
from lmedge.sim import load_scenario
from tests.unit.policies.lyapunov.scenario import slot_obs

ROOT = Path(__file__).resolve().parents[4]


def lyreo_slot(mix: str = "", slot: int = 0) -> SlotObservation:
    """Slot `slot` of examples/lyreo (`mix`: a subdirectory), every server running the LM."""
    scenario = load_scenario(ROOT / "examples" / "lyreo" / mix)
    backend = EmulatedBackend(scenario, seed=1)
    ctx = backend.context()
    running = {n.name: {lm: "gpu" for lm in ctx.lm_names} for n in ctx.workers}
    obs = slot_obs([], running=running, ctx=ctx, slot=slot)
    return obs.model_copy(update={"arrivals": backend.arrivals(slot)})


def window_of(obs: SlotObservation) -> RequestWindow:
    """The slot's arrivals as one window ending at the slot's end, its snapshot the slot's."""
    slot_s = obs.context.loop.slot_s
    return RequestWindow(
        slot=obs.slot,
        start_s=obs.slot * slot_s,
        end_s=(obs.slot + 1) * slot_s,
        context=obs.context,
        snapshot=obs.snapshot,
        requests=[
            WindowRequest(
                id=a.request or f"r{k}",
                origin=a.origin,
                lm=a.lm,
                prompts=max(a.prompts, 1),
                submit_s=obs.slot * slot_s,
                input_tokens=a.input_tokens,
            )
            for k, a in enumerate(obs.arrivals)
        ],
    )
