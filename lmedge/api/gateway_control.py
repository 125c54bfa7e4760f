"""What the controller and the node agent push to a node's gateway.

`PUT /control/routing` carries the slot's routing map (paper §V-D2: "broadcast
to worker nodes via a FastAPI-based control plane"); `PUT /control/models`
the model pods now serving on the node. Both take the gateway's control
credential (`lmedge.dataplane.auth`: in a cluster the sender's own
service-account token).
They live in the contracts because the senders (controller, node agent) sit
beside or below the data plane in the layering and may not import it.
"""

from __future__ import annotations

from pydantic import Field

from lmedge.api.base import WireModel
from lmedge.api.decisions import RoutingMap
from lmedge.api.engines import PodProtocol
from lmedge.api.observations import ClusterContext, Snapshot
from lmedge.api.resources import Modality
from lmedge.api.runconfig import PolicyConfig

__all__ = ["LocalModels", "ModelEndpoint", "PodProtocol", "RequestRouting", "RoutingUpdate"]


class RequestRouting(WireModel):
    """What a gateway needs to route its own requests one by one (request-level routing).

    Pushed with the slot's map when the run's router declares
    `Capabilities.routes_requests`. The gateway builds the same router the
    controller runs from `policy` (the run's policy choice, through the
    plugin catalog: one home, no second router) and calls it on each window
    of its requests with `context` and `snapshot` (the controller's view at
    the slot's start: the deployed (node, model) pairs, their queues), so no
    call leaves the node. A window closes `window_s` after its first request
    or at `window_requests`; the router has `budget_s` after the close, then
    the window goes by the load-aware seed, failing that by the slot's map.
    """

    policy: PolicyConfig = Field(description="The run's policy; the gateway builds its router.")
    context: ClusterContext
    snapshot: Snapshot
    window_s: float = Field(
        default=1.0, gt=0, le=60, allow_inf_nan=False, description="Window, seconds (Δ)."
    )
    window_requests: int = Field(default=128, ge=1, le=4096, description="Most requests a call.")
    budget_s: float = Field(
        default=1.0,
        gt=0,
        le=60,
        allow_inf_nan=False,
        description="Seconds a window's decision may take after it closes (router, then seed).",
    )


class RoutingUpdate(WireModel):
    """`PUT /control/routing`: the slot's routing map, pushed by the controller.

    `run_started_at` (Unix seconds) anchors the run clock that `submit_s` of
    every RequestRecord is measured on. `slot_s` is how long the map stays in
    force (the next push replaces it); the gateway tells a client refused by
    the map's `rejections` to retry after what is left of it. `tau_s` is the
    run's request deadline (its `RunConfig.loop.tau_s`), which the gateway applies
    to the records it writes from then on. None: the gateway's own setting.

    The live cluster rides on the same push: `services` and `classes` are the
    LMServices in force (name -> modality) and the request classes they serve
    (class -> LMs); the gateway serves exactly those from then on, and sets
    waiting for an LM that left end at once with outcome `lm_removed`.
    `lost` names nodes that left the cluster (down or deleted): sets waiting
    at or for them end with outcome `node_lost`. None / empty: no change.

    `requests`: set when the run's router routes request by request; the
    gateway then routes each of its requests in windows (`RequestRouting`)
    and the map is the fallback. None: the map routes.
    """

    run: str = Field(default="", max_length=128)
    slot: int = Field(ge=0)
    run_started_at: float | None = Field(default=None, ge=0)
    slot_s: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="Slot length, seconds."
    )
    tau_s: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="Request deadline tau, seconds."
    )
    routing: RoutingMap
    services: dict[str, Modality] | None = Field(
        default=None, description="The LMServices in force, name -> modality."
    )
    classes: dict[str, list[str]] | None = Field(
        default=None, description="Request class -> the LMs serving it (manifest order)."
    )
    lost: list[str] = Field(
        default_factory=list, description="Nodes that left the cluster since the last push."
    )
    requests: RequestRouting | None = Field(
        default=None, description="Request-level routing at the gateway; None: the map routes."
    )


class ModelEndpoint(WireModel):
    """One model pod serving on the node: its LM, base URL, protocol and concurrency."""

    lm: str = Field(min_length=1, max_length=63)
    url: str = Field(min_length=1, max_length=512, pattern=r"^https?://")
    protocol: PodProtocol = Field(
        default="pipeline", description="pipeline (lmedge model-server) or openai (an engine)."
    )
    concurrency: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="Requests the pod serves at once (an engine's batch slots; 1 for a "
        "pipeline pod): the gateway runs up to this many of the LM's queue together.",
    )


class LocalModels(WireModel):
    """`PUT /control/models`: the model pods now serving on this node (replaces the set).

    An LM is *active* at this node exactly when it is listed here; the node
    agent pushes the set whenever it starts or stops a pod.
    """

    models: list[ModelEndpoint] = Field(max_length=256)
