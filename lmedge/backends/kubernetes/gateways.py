"""The control plane's client of the node gateways (the only backend module that
imports httpx).

Three control endpoints of `lmedge.dataplane.app`, all with the control
credential (`BearerToken`: a token, or a file holding one; in a cluster the
caller's projected service-account token, which the gateway verifies with a
TokenReview and authorizes by identity):

- `PUT /control/routing` — the slot's routing map, pushed by the controller
  (the paper's per-slot broadcast);
- `PUT /control/models` — the model pods serving on a node, pushed by its node
  agent after it starts or stops pods;
- `GET /control/status` — the gateway's per-LM queue depth, which is the
  backlog Q_ni of the snapshot.

The bodies are the control models of `lmedge.api.gateway_control`
(`RoutingUpdate`, built once by the backend; `LocalModels`), the same classes
the gateway validates them with, so a sender cannot drift from the receiver's
schema.

A gateway that does not answer is logged and skipped: one slow node must not
stall the slot for every other node. The caller learns which pushes failed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from lmedge.api.gateway_control import LocalModels, ModelEndpoint, RoutingUpdate
from lmedge.tokens import BearerToken

__all__ = ["GatewayClient", "models_body"]

log = logging.getLogger(__name__)


def models_body(models: Sequence[ModelEndpoint]) -> dict[str, Any]:
    """A `LocalModels` message as JSON: the node's serving pods, by LM."""
    return LocalModels(models=sorted(models, key=lambda m: m.lm)).model_dump(mode="json")


class GatewayClient:
    """Pushes to and reads from the gateways named in `urls` ({node: base URL}).

    `token` is the control credential (`BearerToken`). `template` (a URL with
    `{node}`) names the gateway of a node added later (`add_nodes`). `timeout_s`
    (default 2 s) bounds each call: a push that takes longer than
    a fraction of a slot is worse than a skipped one, since the gateway keeps
    the previous slot's map.
    """

    def __init__(
        self,
        urls: Mapping[str, str],
        token: str | Path | None = None,
        timeout_s: float = 2.0,
        transport: httpx.BaseTransport | None = None,
        *,
        template: str | None = None,
    ) -> None:
        self.urls = {node: url.rstrip("/") for node, url in urls.items()}
        self.template = template
        auth = BearerToken(token) if token else None
        self._http = httpx.Client(timeout=timeout_s, auth=auth, transport=transport)

    def add_nodes(self, nodes: Iterable[str]) -> list[str]:
        """Give each node without a gateway URL its `template` URL; the nodes added."""
        if self.template is None:
            return []
        added = [n for n in nodes if n not in self.urls]
        for node in added:
            self.urls[node] = self.template.format(node=node).rstrip("/")
        return added

    def push_routing(self, update: RoutingUpdate) -> list[str]:
        """PUT the slot's `update` to every gateway; the nodes whose gateway failed."""
        body = update.model_dump(mode="json")
        return [n for n in sorted(self.urls) if not self._put(n, "/control/routing", body)]

    def push_models(self, node: str, models: Sequence[ModelEndpoint]) -> bool:
        """PUT `node`'s serving model pods to its gateway; False if it failed."""
        if node not in self.urls:
            return False
        return self._put(node, "/control/models", models_body(models))

    def queue_depths(self, nodes: Sequence[str]) -> dict[str, dict[str, int]]:
        """{node: {lm: prompts waiting or in service}} for the gateways that answered."""
        out: dict[str, dict[str, int]] = {}
        for node in nodes:
            url = self.urls.get(node)
            if url is None:
                continue
            try:
                resp = self._http.get(url + "/control/status")
                resp.raise_for_status()
                depth = resp.json().get("queue_depth") or {}
                out[node] = {str(lm): int(n) for lm, n in depth.items()}
            except (httpx.HTTPError, ValueError, AttributeError) as exc:
                log.warning("gateway of %s: no status (%s)", node, exc)
        return out

    def _put(self, node: str, path: str, body: dict[str, Any]) -> bool:
        try:
            self._http.put(self.urls[node] + path, json=body).raise_for_status()
        except httpx.HTTPError as exc:
            log.warning("gateway of %s: PUT %s failed (%s)", node, path, exc)
            return False
        return True

    def close(self) -> None:
        self._http.close()
