"""A control plane and data plane of one run on the test cluster, in one process:
what the live-cluster tests (test_live_cluster.py) and the apply-to-first-route
benchmark (benchmarks/test_live_bench.py) drive.

- the controller: `run_controller` (leader election, loop, watch cache) in a
  thread, with the `rf` profile;
- a node agent per agent node (`NodeAgent`, `full` deployer) in a thread;
- optionally a real gateway per agent node (`create_app` under uvicorn on
  127.0.0.1, building a pushed request-level router as `lmedge gateway`
  does) writing records to the run's store, and a stub model server per
  LM. KWOK pods have no reachable address, so a "kubelet" thread stands in
  for the node agents' model push: when a model pod is Ready on a node, that
  node's gateway is told the stub server's URL for its LM (the agents' own
  push is off: their gateway URL is unset).
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from lmedge.api import LoopConstants, RoutingMap
from lmedge.backends.kubernetes.backend import KubernetesBackend, KubernetesSettings, WallClock
from lmedge.backends.kubernetes.client import KubeClient
from lmedge.backends.kubernetes.pods import LABEL_LM
from lmedge.controller.assembly import PolicyChoice
from lmedge.controller.catalog import BuildContext, build_deployer
from lmedge.dataplane.app import ApiSettings, create_app
from lmedge.dataplane.clients import HttpClients
from lmedge.dataplane.gateway import Gateway, GatewaySettings
from lmedge.dataplane.records import StoreSink
from lmedge.errors import LmedgeError
from lmedge.modelserver.app import ModelServer
from lmedge.modelserver.app import create_app as create_model_app
from lmedge.modelserver.backends import StubBackend
from lmedge.nodeagent.agent import NodeAgent
from lmedge.processes.controller import ControllerSettings, run_controller
from lmedge.processes.gateway import build_router, build_seed
from lmedge.store import Store, open_store
from tests.fixtures.cluster import REPO, wait_until
from tests.fixtures.dataplane import CONTROL, TOKEN, ServerThread, control, free_port

GROUP, VERSION = "lmedge.io", "v1alpha1"
SYSTEM = "lmedge-system"
AGENT_NODES = ("worker-1", "worker-2")
WAIT = 45.0  # seconds for a change to show; dozens of slots on a loaded machine


def services_yaml() -> dict[str, dict[str, Any]]:
    docs = yaml.safe_load_all((REPO / "examples/testbed/services.yaml").read_text())
    return {d["metadata"]["name"]: d for d in docs if d}


def lm5() -> dict[str, Any]:
    """A new text LMService: lm1's spec under another name."""
    doc = copy.deepcopy(services_yaml()["lm1"])
    doc["metadata"] = {"name": "lm5"}
    doc["spec"]["serves"] = []
    return doc


def model_pods(core: client.CoreV1Api, ns: str, lm: str | None = None) -> list[Any]:
    selector = f"{LABEL_LM}={lm}" if lm else LABEL_LM
    pods = core.list_namespaced_pod(ns, label_selector=selector).items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


@dataclass
class Plane:
    """The processes of one run, as threads of this one (module docstring)."""

    namespace: str
    run: str
    store: Store
    store_dir: Path
    slot_s: float = 1.0
    #: the nodes with a node agent (and, with a data plane, a gateway)
    nodes: tuple[str, ...] = AGENT_NODES
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    gateways: dict[str, str] = field(default_factory=dict)  # node -> URL
    servers: list[ServerThread] = field(default_factory=list)

    def spawn(self, target: Callable[[], None], name: str) -> None:
        def guarded() -> None:
            try:
                target()
            except BaseException as exc:  # reported by `close`'s caller
                self.errors.append(exc)

        t = threading.Thread(target=guarded, name=name, daemon=True)
        t.start()
        self.threads.append(t)

    def routing(self) -> RoutingMap | None:
        """The controller's newest slot map (not a gateway's window audit: those are
        `scheduler` decisions of the run too, with an empty map)."""
        found = self.store.decisions(agent="scheduler", run=self.run, limit=50)
        value = next((d.value for d in found if d.window is None), None)
        return value if isinstance(value, RoutingMap) else None

    def routed(self) -> set[tuple[str, str, str]]:
        """(origin, lm, destination) of the newest routing map."""
        r = self.routing()
        return {(x.origin, x.lm, x.destination) for x in r.routes} if r else set()

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)
        for s in self.servers:
            s.stop()


def start_controller(
    plane: Plane,
    kube: KubeClient,
    lease: str,
    *,
    epoch_slots: int = 30,
    identity: str = "",
    profile: str = "rf",
    stop: threading.Event | None = None,
) -> None:
    """Start `run_controller` in a thread; it stops with `stop` (default: the plane's)."""
    settings = ControllerSettings(
        backend=KubernetesSettings(
            namespace=plane.namespace,
            # tau: a set that cannot be served ends within the test's patience
            loop=LoopConstants(slot_s=plane.slot_s, epoch_slots=epoch_slots, tau_s=20.0),
            run=plane.run,
            gateways=dict(plane.gateways),
            control_token=CONTROL if plane.gateways else None,
        ),
        policy=PolicyChoice(profile=profile),
        lease_namespace=SYSTEM,
        lease_name=lease,
        identity=identity or f"replica-{uuid.uuid4().hex[:4]}",
        operator=False,  # the tests' KopfRunner operates
        lease_duration_s=6.0,
    )

    def controller() -> None:
        store = open_store(str(plane.store_dir))
        try:
            run_controller(settings, kube, store, stop=stop or plane.stop)
        finally:
            store.close()

    plane.spawn(controller, "controller")


def run_start(plane: Plane) -> float:
    """The run's start (Unix s) once the controller stored the run."""

    def started() -> bool:
        try:
            return any(r.id == plane.run for r in plane.store.runs(limit=5))
        except LmedgeError:  # nothing stored yet, or the store is being created
            return False

    wait_until(started, WAIT, f"the controller to store run {plane.run}")
    (run,) = [r for r in plane.store.runs(limit=5) if r.id == plane.run]
    return run.started.replace(tzinfo=UTC).timestamp()


def start_agents(plane: Plane, kube: KubeClient) -> None:
    start = run_start(plane)
    for node in plane.nodes:

        def agent(node: str = node) -> None:
            store = open_store(str(plane.store_dir))
            backend = KubernetesBackend(
                kube,
                KubernetesSettings(
                    namespace=plane.namespace,
                    loop=LoopConstants(slot_s=plane.slot_s),
                    run=plane.run,
                ),
                store=store,
                clock=WallClock(start),
            )
            deployer = build_deployer("full", BuildContext(backend.context(), 0))
            try:
                NodeAgent(node, backend, deployer, store=store).run(stop=plane.stop)
            finally:
                backend.close()
                store.close()

        plane.spawn(agent, f"agent-{node}")


def plan_gateways(plane: Plane) -> None:
    """Choose the gateways' ports (before the controller starts: it pushes to them)."""
    plane.gateways = {n: f"http://127.0.0.1:{free_port()}" for n in plane.nodes}


def start_data_plane(
    plane: Plane, kube: KubeClient, tmp: Path, modalities: dict[str, str]
) -> dict[str, str]:
    """A gateway per agent node and a stub model server per LM; returns {lm: model URL}.

    Gateways start knowing no LMService: the controller's pushes tell them.
    """
    models: dict[str, str] = {}
    for lm, modality in modalities.items():
        backend = StubBackend(lm=lm, modality=modality, seconds=0.0)  # type: ignore[arg-type]
        server = ModelServer(lm, backend, tmp / f"progress-{lm}")
        thread = ServerThread(create_model_app(server, load_in_background=False)).start()
        plane.servers.append(thread)
        models[lm] = thread.url
    for node, url in plane.gateways.items():
        store = open_store(str(plane.store_dir))
        settings = GatewaySettings(node=node, services={}, peers=dict(plane.gateways))
        clients = HttpClients(token=CONTROL)
        core = Gateway(
            settings,
            peers=clients,
            models=clients,
            sink=StoreSink(store),
            # what `lmedge gateway` builds a pushed request-level router with
            build_router=build_router,
            build_seed=build_seed,
        )
        app = create_app(core, ApiSettings(token=TOKEN, control_token=CONTROL))
        app.state.closers.append(clients.aclose)
        port = int(url.rsplit(":", 1)[1])
        plane.servers.append(ServerThread(app, port).start())

    def kubelet() -> None:
        core_api = client.CoreV1Api(kube.api)
        pushed: dict[str, dict[str, str]] = {}
        while not plane.stop.wait(0.3):
            try:
                pods = model_pods(core_api, plane.namespace)
            except Exception:  # the API server is busy: next round
                continue
            for node, gw in plane.gateways.items():
                ready = {
                    p.metadata.labels[LABEL_LM]: models[p.metadata.labels[LABEL_LM]]
                    for p in pods
                    if p.spec.node_name == node
                    and p.metadata.labels.get(LABEL_LM) in models
                    and any(c.type == "Ready" and c.status == "True"
                            for c in (p.status.conditions or []))
                }  # fmt: skip
                if ready == pushed.get(node):
                    continue
                body = {"models": [{"lm": lm, "url": u} for lm, u in sorted(ready.items())]}
                try:
                    control(gw, "/control/models", body)
                except Exception:  # an LM this gateway was not told of yet: next round
                    continue
                pushed[node] = ready

    plane.spawn(kubelet, "kubelet")
    return models
