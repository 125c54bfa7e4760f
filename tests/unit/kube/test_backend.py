"""Kubernetes backend logic that needs no API server: node state from pods,
the retry boundary, the gateway messages, arrivals and the wall clock."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from lmedge.api import ClusterContext, LMPlacement, LoopConstants, RequestRecord, Route, RoutingMap
from lmedge.api.gateway_control import ModelEndpoint
from lmedge.api.manifests import load_resources
from lmedge.api.runconfig import PolicyConfig
from lmedge.backends.kubernetes.backend import (
    KubernetesBackend,
    KubernetesSettings,
    WallClock,
    load_context,
    node_state,
)
from lmedge.backends.kubernetes.client import ClusterRefused, KubeClient, RetryPolicy
from lmedge.backends.kubernetes.gateways import GatewayClient, models_body
from lmedge.backends.kubernetes.pods import model_pod, observe_pod
from lmedge.dataplane.wire import LocalModels, RoutingUpdate
from lmedge.errors import ClusterUnavailable, NotFound
from lmedge.nodeagent.agent import serving_endpoints

EXAMPLES = Path(__file__).parents[3] / "examples" / "testbed"
NODES, SERVICES = load_resources(EXAMPLES)
SVC = {s.name: s for s in SERVICES}
NODE = {n.name: n for n in NODES}


def live(
    lm: str, placement: LMPlacement, node: str, *, ready: bool, ip: str = ""
) -> dict[str, Any]:
    pod = model_pod(SVC[lm], placement, node, "ns")
    pod["status"] = {
        "phase": "Running" if ready else "Pending",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "podIP": ip,
    }
    return pod


GPU = LMPlacement(lm="lm4", mode="gpu", cpu_cores=2.5, vgpus=2)
CPU = LMPlacement(lm="lm1", mode="cpu", cpu_cores=4, vgpus=0)


def test_observe_pod_reads_back_what_model_pod_wrote() -> None:
    seen = observe_pod(live("lm4", GPU, "worker-6", ready=False))

    assert (seen.lm, seen.node, seen.mode, seen.vgpus) == ("lm4", "worker-6", "gpu", 2)
    assert seen.cpu_cores == pytest.approx(2.5)
    assert seen.memory_gib == pytest.approx(SVC["lm4"].spec.deployment_memory_gib)
    assert seen.pending and not seen.ready


def test_node_state_counts_instances_and_headroom() -> None:
    pods = [
        observe_pod(live("lm4", GPU, "worker-6", ready=True)),
        observe_pod(live("lm1", CPU, "worker-6", ready=False)),
        observe_pod(live("lm1", CPU, "worker-5", ready=True)),  # another node: ignored
    ]

    state = node_state(NODE["worker-6"], pods, SVC, {"lm4": 7})

    spec = NODE["worker-6"].spec
    assert [(i.lm, i.mode, i.status) for i in state.instances] == [
        ("lm1", "cpu", "pending"),
        ("lm4", "gpu", "ready"),
    ]
    assert state.pending
    assert state.free_cpu_cores == pytest.approx(spec.cpu_cores - 6.5)
    assert state.free_vgpus == spec.total_vgpus - 2
    assert state.free_vram_gib == pytest.approx(spec.total_vram_gib - SVC["lm4"].spec.min_vram_gib)
    assert state.backlog == {"lm4": 7}


def test_terminating_pods_hold_resources_but_are_not_instances() -> None:
    pod = live("lm4", GPU, "worker-6", ready=True)
    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"

    state = node_state(NODE["worker-6"], [observe_pod(pod)], SVC)

    assert state.instances == []
    assert state.free_vgpus == NODE["worker-6"].spec.total_vgpus - 2


def test_serving_endpoints_lists_ready_pods_only() -> None:
    pods = [
        observe_pod(live("lm4", GPU, "worker-6", ready=True, ip="10.0.0.7")),
        observe_pod(live("lm1", CPU, "worker-6", ready=False, ip="10.0.0.8")),
    ]

    assert serving_endpoints(pods) == {"lm4": "http://10.0.0.7:8000"}


# -- the retry boundary --------------------------------------------------------


def client(attempts: int = 3) -> KubeClient:
    from kubernetes import client as k8s

    return KubeClient(k8s.ApiClient(), RetryPolicy(attempts=attempts, backoff_s=0.0))


def failing(*errors: BaseException) -> Any:
    queue = list(errors)

    def call(*args: Any, **kwargs: Any) -> str:
        assert "_request_timeout" in kwargs
        if queue:
            raise queue.pop(0)
        return "ok"

    return call


def api_error(status: int, message: str = "") -> ApiException:
    exc = ApiException(status=status, reason="Reason")
    exc.body = json.dumps({"message": message})
    return exc


@pytest.mark.parametrize(
    "error",
    [
        api_error(429),
        api_error(503),
        api_error(409, "conflict"),
        urllib3.exceptions.ReadTimeoutError(None, "", "t"),
        ConnectionResetError(),
    ],
    ids=["throttled", "unavailable", "conflict", "timeout", "reset"],
)
def test_transient_failures_are_retried(error: BaseException) -> None:
    assert client().call("act", failing(error, error)) == "ok"


def test_persistent_transient_failure_becomes_cluster_unavailable() -> None:
    with pytest.raises(ClusterUnavailable, match="act: HTTP 503"):
        client(attempts=2).call("act", failing(api_error(503), api_error(503)))


@pytest.mark.parametrize("status", [400, 403, 422])
def test_refusals_are_not_retried(status: int) -> None:
    fn = failing(api_error(status, "denied by policy"), api_error(status))

    with pytest.raises(ClusterRefused) as refused:
        client().call("create pod", fn)

    assert (refused.value.status, refused.value.message) == (status, "denied by policy")


def test_not_found_is_classified_once_and_never_retried() -> None:
    calls: list[int] = []

    def missing(*args: Any, **kwargs: Any) -> str:
        calls.append(1)
        raise api_error(404)

    with pytest.raises(NotFound, match="read Node w9: not found") as err:
        client(attempts=3).call("read Node w9", missing)
    assert isinstance(err.value.__cause__, ApiException) and len(calls) == 1


# -- gateway messages ------------------------------------------------------------

ROUTES = RoutingMap(routes=[Route(origin="worker-1", lm="lm1", destination="worker-2")])


def test_bodies_validate_as_the_data_plane_messages() -> None:
    endpoint = ModelEndpoint(lm="lm1", url="http://10.0.0.1:8000")
    models = LocalModels.model_validate(models_body([endpoint]))

    assert models.models[0].lm == "lm1"


def test_gateway_client_pushes_and_reads_queue_depths() -> None:
    seen: list[tuple[str, str, str | None]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, str(request.url), request.headers.get("authorization")))
        if request.url.host == "down":
            return httpx.Response(503)
        if request.method == "GET":
            return httpx.Response(200, json={"queue_depth": {"lm1": 3}})
        return httpx.Response(200, json={})

    gw = GatewayClient(
        {"worker-1": "http://up/", "worker-2": "http://down"},
        token="t",
        transport=httpx.MockTransport(handle),
    )

    assert gw.push_routing(RoutingUpdate(run="r", slot=0, routing=ROUTES)) == ["worker-2"]
    assert gw.queue_depths(["worker-1", "worker-2", "worker-3"]) == {"worker-1": {"lm1": 3}}
    assert ("PUT", "http://up/control/routing", "Bearer t") in seen
    gw.close()


def test_a_node_that_joins_gets_its_gateway_from_the_template() -> None:
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200, json={})

    gw = GatewayClient(
        {"worker-1": "http://w1:8080"},
        transport=httpx.MockTransport(handle),
        template="http://{node}.gw:8080/",
    )
    assert gw.add_nodes(["worker-1", "worker-7"]) == ["worker-7"]
    assert gw.add_nodes(["worker-7"]) == []
    assert gw.push_routing(RoutingUpdate(run="r", slot=0, routing=ROUTES)) == []
    assert sorted(seen) == [
        "http://w1:8080/control/routing",
        "http://worker-7.gw:8080/control/routing",
    ]
    assert GatewayClient({}).add_nodes(["worker-7"]) == []  # no template: nothing to add
    gw.close()


# -- arrivals and the clock ---------------------------------------------------------


class ListingOnly(KubeClient):
    """The thin client answering lists from the example manifests."""

    def __init__(self) -> None:
        super().__init__(client().api)

    def list_edge_nodes(self) -> list[dict[str, Any]]:
        return [
            {"metadata": {"name": n.name}, "spec": n.spec.model_dump(by_alias=True)} for n in NODES
        ]

    def list_lmservices(self, namespace: str) -> list[dict[str, Any]]:
        return [
            {
                "metadata": {"name": s.name, "uid": f"uid-{s.name}"},
                "spec": s.spec.model_dump(by_alias=True),
            }
            for s in SERVICES
        ]


class Records:
    def __init__(self, records: list[RequestRecord]) -> None:
        self.records = records
        self.read = 0

    def requests(self, run: str) -> list[RequestRecord]:
        return list(self.records)

    def requests_after(self, cursor: Any) -> list[RequestRecord]:
        """The records not read yet (a feed: consumed as read)."""
        fresh, self.read = self.records[self.read :], len(self.records)
        return fresh


def record(i: int, origin: str, lm: str, prompts: int) -> RequestRecord:
    return RequestRecord(id=f"r{i}", run="run", lm=lm, origin=origin, destination=origin,
                         prompts=prompts, slot=0, submit_s=0.0, outcome="success")  # fmt: skip


def test_arrivals_cover_every_pair_with_last_slot_counts() -> None:
    store: Any = Records([record(1, "worker-2", "lm1", 3), record(2, "worker-2", "lm1", 2)])
    backend = KubernetesBackend(
        ListingOnly(), KubernetesSettings(run="run", watch=False), store=store
    )
    workers = [n.name for n in NODES if n.spec.role == "worker"]

    before = backend.arrivals(0)
    drained = backend.drain_records()
    after = {(a.origin, a.lm): (a.requests, a.prompts) for a in backend.arrivals(1)}
    again = backend.drain_records()
    quiet = {(a.origin, a.lm): (a.requests, a.prompts) for a in backend.arrivals(2)}

    assert {(a.origin, a.lm) for a in before} == {(w, s.name) for w in workers for s in SERVICES}
    assert all(a.requests == 0 for a in before)
    assert [r.id for r in drained] == ["r1", "r2"]
    assert after[("worker-2", "lm1")] == (2, 5)
    assert sum(r for r, _ in after.values()) == 2
    assert again == []  # idempotent: a record is drained once
    assert set(quiet.values()) == {(0, 0)}


def test_a_controller_started_on_a_running_cluster_routes_through_every_gateway() -> None:
    # The EdgeNodes exist before the backend does (a restarted controller, a new
    # leader): its first refresh sees no change, yet every worker's gateway gets the map.
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200, json={"routes": 1, "slot": 0})

    gateways = GatewayClient(
        {}, transport=httpx.MockTransport(handle), template="http://{node}:8080"
    )
    backend = KubernetesBackend(
        ListingOnly(), KubernetesSettings(run="run", watch=False), store=Records([]),
        gateways=gateways,
    )  # fmt: skip
    assert not backend.refresh(0).changed
    backend.publish_routing(0, ROUTES)

    workers = sorted(n.name for n in NODES if n.spec.role == "worker")
    assert workers and sorted(seen) == [f"http://{w}:8080/control/routing" for w in workers]
    gateways.close()


def test_the_routing_push_carries_the_runs_loop_constants() -> None:
    bodies: list[bytes] = []

    def handle(request: httpx.Request) -> httpx.Response:
        bodies.append(request.content)
        return httpx.Response(200, json={})

    gateways = GatewayClient({"worker-1": "http://w1"}, transport=httpx.MockTransport(handle))
    settings = KubernetesSettings(
        run="run-1", watch=False, loop=LoopConstants(slot_s=2.0, tau_s=60.0)
    )
    backend = KubernetesBackend(
        ListingOnly(), settings, store=Records([]), clock=WallClock(1700000000.0),
        gateways=gateways,
    )  # fmt: skip
    backend.publish_routing(4, ROUTES)

    (body,) = bodies
    update = RoutingUpdate.model_validate_json(body)  # what the gateway validates it with
    assert (update.run, update.slot, update.routing) == ("run-1", 4, ROUTES)
    assert (update.slot_s, update.tau_s, update.run_started_at) == (2.0, 60.0, 1700000000.0)
    assert update.services == {s.name: s.spec.modality for s in SERVICES}
    assert update.lost == []
    gateways.close()


def test_load_context_is_the_live_watchs_context_with_the_settings_constants() -> None:
    loop = LoopConstants(slot_s=5.0, epoch_slots=3)
    settings = KubernetesSettings(watch=False, loop=loop)

    ctx, uids = load_context(ListingOnly(), settings)
    backend = KubernetesBackend(ListingOnly(), settings)

    assert ctx == backend.context() and ctx.loop == loop
    assert uids == {s.name: f"uid-{s.name}" for s in SERVICES}


def test_wall_clock_counts_from_its_start() -> None:
    clock = WallClock(time.time() - 10.0)

    assert clock.now() >= 10.0  # started 10 s ago
    assert clock.slot(3.0) >= 3
    clock.sleep_until(clock.now() + 0.2)
    before = clock.now()
    clock.sleep_until(before + 0.2)
    # the guarantee: it never returns before the time asked for
    assert clock.now() >= before + 0.2


def test_a_token_engine_pod_is_registered_with_its_protocol_and_batch() -> None:
    """The node agent tells its gateway what each pod speaks and how many requests it
    serves at once, from its LMService's engine and the pod's mode."""
    from lmedge.api.engines import concurrent_requests
    from lmedge.nodeagent.agent import model_endpoints

    _, engine_services = load_resources(EXAMPLES.parent / "llama-cpp")
    chat = engine_services[0]
    ctx = ClusterContext(nodes=NODES, services=[SVC["lm1"], chat])
    cpu = LMPlacement(lm=chat.name, mode="cpu", cpu_cores=2, vgpus=0)
    pods = [
        observe_pod(live("lm1", LMPlacement(lm="lm1", mode="cpu", cpu_cores=2, vgpus=0),
                         "worker-1", ready=True, ip="10.0.0.1")),
        observe_pod({**model_pod(chat, cpu, "worker-1", "ns"), "status": {
            "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
            "podIP": "10.0.0.2"}}),
    ]  # fmt: skip
    got = {m.lm: m for m in model_endpoints(ctx, pods)}
    assert (got["lm1"].protocol, got["lm1"].concurrency) == ("pipeline", 1)
    assert got[chat.name].protocol == "openai"
    assert got[chat.name].concurrency == concurrent_requests(chat.spec, "cpu")
    assert got[chat.name].url == "http://10.0.0.2:8000"
    # llama-server is started with as many --parallel slots as the gateway sends at once
    args = model_pod(chat, cpu, "worker-1", "ns")["spec"]["containers"][0]["args"]
    assert args[args.index("--parallel") + 1] == str(got[chat.name].concurrency)
    body = LocalModels.model_validate(models_body(list(got.values())))
    assert {m.lm: m.concurrency for m in body.models} == {
        "lm1": 1,
        chat.name: got[chat.name].concurrency,
    }


class ListingNoPods(ListingOnly):
    def list_model_pods(self, namespace: str | None, node: str | None = None) -> list[Any]:
        return []


def test_the_push_carries_request_routing_once_the_loop_installs_it() -> None:
    # loop._install_request_router -> route_requests_at_gateways -> _requests_push:
    # every later push carries the policy, the context and the slot's snapshot.
    bodies: list[bytes] = []

    def handle(request: httpx.Request) -> httpx.Response:
        if request.method == "PUT":
            bodies.append(request.content)
        return httpx.Response(200, json={})

    gateways = GatewayClient({"worker-1": "http://w1"}, transport=httpx.MockTransport(handle))
    store: Any = Records([])
    backend = KubernetesBackend(
        ListingNoPods(), KubernetesSettings(run="run", watch=False), store=store,
        gateways=gateways,
    )  # fmt: skip
    backend.publish_routing(0, ROUTES)
    policy = PolicyConfig(profile="cema-request", seed=7)
    backend.route_requests_at_gateways(policy, 0.5, 64)
    snapshot = backend.snapshot(1)
    backend.publish_routing(1, ROUTES)

    before, after = (RoutingUpdate.model_validate_json(b) for b in bodies)
    assert before.requests is None  # the map, until a router routes requests
    pushed = after.requests
    assert pushed is not None
    assert (pushed.policy, pushed.window_s, pushed.window_requests) == (policy, 0.5, 64)
    assert pushed.budget_s == 0.5
    assert pushed.snapshot == snapshot and pushed.context == backend.context()
    gateways.close()


ENGINE_PAGES = Path(__file__).parents[2] / "fixtures" / "engines"


class ListingEnginePods(ListingOnly):
    """The testbed with examples/llama-cpp's LMService added, and the given pods."""

    def __init__(self, chat: Any, pods: list[Any]) -> None:
        super().__init__()
        self.chat, self.pods = chat, pods

    def list_lmservices(self, namespace: str) -> list[dict[str, Any]]:
        chat = {
            "metadata": {"name": self.chat.name, "uid": "uid-chat"},
            "spec": self.chat.spec.model_dump(by_alias=True),
        }
        return [*super().list_lmservices(namespace), chat]

    def list_model_pods(self, namespace: str | None, node: str | None = None) -> list[Any]:
        return [p for p in self.pods if node is None or p.node == node]


def test_the_snapshot_and_the_request_routing_push_carry_the_engines_telemetry() -> None:
    # What a gateway's LYREO or CEMA router routes on (KV usage, running and waiting
    # sequences): the controller reads its token-engine pods into every snapshot.
    from lmedge.nodeagent.telemetry import EngineScraper

    _, (chat,) = load_resources(EXAMPLES.parent / "llama-cpp")
    cpu = LMPlacement(lm=chat.name, mode="cpu", cpu_cores=2, vgpus=0)
    running = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    pods = [
        observe_pod({**model_pod(chat, cpu, "worker-1", "ns"),
                     "status": {**running, "podIP": "10.0.0.2"}}),
        # a pipeline pod's page counts prompts: not read
        observe_pod(live("lm1", CPU, "worker-2", ready=True, ip="10.0.0.3")),
    ]  # fmt: skip
    asked: list[str] = []

    def engine(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        return httpx.Response(200, text=(ENGINE_PAGES / "llamacpp-kv.txt").read_text())

    pushed: list[bytes] = []

    def gateway(request: httpx.Request) -> httpx.Response:
        if request.method == "PUT":
            pushed.append(request.content)
        return httpx.Response(200, json={})

    gateways = GatewayClient({"worker-1": "http://w1"}, transport=httpx.MockTransport(gateway))
    store: Any = Records([])
    backend = KubernetesBackend(
        ListingEnginePods(chat, pods), KubernetesSettings(run="run", watch=False),
        store=store, gateways=gateways,
        engines=EngineScraper(clock=lambda: 30.0, transport=httpx.MockTransport(engine)),
    )  # fmt: skip
    backend.route_requests_at_gateways(PolicyConfig(profile="lyreo"), 1.0, 128)
    snapshot = backend.snapshot(1)
    backend.publish_routing(1, ROUTES)

    assert asked == ["http://10.0.0.2:8000/metrics"]
    engines = {n.name: n.engines for n in snapshot.nodes}
    (read,) = engines.pop("worker-1") or []
    assert (read.lm, read.pod, read.kv_cache_usage) == (chat.name, pods[0].name, 0.625)
    assert set(engines.values()) == {None}  # no token-engine pod there
    (update,) = (RoutingUpdate.model_validate_json(b) for b in pushed)
    assert update.requests is not None and update.requests.snapshot == snapshot
    gateways.close()
