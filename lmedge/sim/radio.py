"""Users with positions and their wireless uplink to the edge servers (LYREO §III-B).

A scenario with `workload.users` has mobile users in a square area instead of
per-node origins: each slot every user is at a uniform position and sends
one request with probability `activity`. The server they send it to shares
its uplink band among every request sent to it in the slot:

    rate(u, s) = (B / n_s) * log2(1 + P * max(d(u, s), 1 m)^-alpha / N0)

B the band of one server (Hz), n_s the requests routed to s in the slot,
P the user's transmit power (W), alpha the path-loss exponent, N0 the noise
power (W). A request's uplink time is its input tokens x bits per token over
that rate. Servers sit at the centres of a near-square grid over the area, in
manifest order (`server_positions`). Pure: no randomness (the workload draws
the positions) and no time.

Not modelled: the downlink (the paper's latency has none: the answer streams
back as it is generated), fading, interference between servers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import Field

from lmedge.api.base import SpecModel

__all__ = ["RadioSpec", "UsersSpec", "server_positions", "uplink_s"]


class RadioSpec(SpecModel):
    """The uplink channel (see the module docstring). Defaults: assumptions, not the paper's."""

    bandwidth_hz: float = Field(
        default=1e6, gt=0, description="Uplink band of one server, shared by its requests, Hz."
    )
    tx_power_w: float = Field(default=0.1, gt=0, description="User transmit power, W (20 dBm).")
    noise_w: float = Field(default=1e-13, gt=0, description="Noise power N0, W (-100 dBm).")
    path_loss_exponent: float = Field(default=3.5, gt=0, description="alpha in d^-alpha.")
    bits_per_token: float = Field(
        default=16, gt=0, description="Bits a prompt token takes on the air (LYREO: 16)."
    )


class UsersSpec(SpecModel):
    """Mobile users in a square area; replaces the per-node origins of the generator."""

    count: int = Field(ge=1, le=100_000, description="Users; each may send one request a slot.")
    activity: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="Chance a user sends a request in a slot (LYREO: every user, every slot).",
    )
    area_m: float = Field(default=200.0, gt=0, description="Side of the square area, m.")
    radio: RadioSpec = Field(default_factory=RadioSpec)


def server_positions(names: Sequence[str], area_m: float) -> dict[str, tuple[float, float]]:
    """Each server at the centre of its cell of a ceil(sqrt(n))-column grid, row by row."""
    n = len(names)
    cols = max(1, math.ceil(math.sqrt(n)))
    rows = max(1, math.ceil(n / cols))
    return {
        name: ((k % cols + 0.5) * area_m / cols, (k // cols + 0.5) * area_m / rows)
        for k, name in enumerate(names)
    }


def uplink_s(
    radio: RadioSpec, user: tuple[float, float], server: tuple[float, float], tokens: int, n: int
) -> float:
    """Seconds to send `tokens` prompt tokens from `user` to `server` sharing its band with
    `n` requests (n >= 1) in the slot."""
    d = max(math.dist(user, server), 1.0)
    snr = radio.tx_power_w * d**-radio.path_loss_exponent / radio.noise_w
    rate = radio.bandwidth_hz / max(n, 1) * math.log2(1.0 + snr)
    return tokens * radio.bits_per_token / rate
