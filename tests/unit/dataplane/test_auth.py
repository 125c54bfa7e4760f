"""The gateway's credentials (lmedge.dataplane.auth): the user token never
opening the control API, and the service-account identity rules, with a
reviewer standing in for the API server (the real TokenReview is
tests/integration/test_gateway_auth.py). The Bearer scheme itself is
tests/unit/test_tokens.py."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest

from lmedge.dataplane.app import ApiSettings, create_app
from lmedge.dataplane.auth import Denied, Review, ServiceAccountAuth
from lmedge.dataplane.clients import HttpClients
from lmedge.dataplane.gateway import Gateway, GatewaySettings
from lmedge.dataplane.records import MemorySink
from lmedge.errors import ClusterUnavailable, ConfigError

CONTROLLER = "system:serviceaccount:lmedge-system:lmedge-controller"
AGENT = "system:serviceaccount:lmedge-system:lmedge-node-agent"


def test_a_user_token_without_a_control_credential_is_refused() -> None:
    with pytest.raises(ConfigError, match="a user API token is set but no control credential"):
        ApiSettings(token="user")
    assert ApiSettings(token="user", control_token="control").control is not None
    assert ApiSettings().control is None  # development: everything open


def _app(api: ApiSettings) -> httpx.AsyncClient:
    clients = HttpClients()
    core = Gateway(
        GatewaySettings(node="n1", services={"lm1": "text-to-text"}),
        peers=clients,
        models=clients,
        sink=MemorySink(),
    )
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(core, api)), base_url="http://gw"
    )


def test_the_user_token_does_not_open_the_control_api() -> None:
    async def go() -> tuple[int, int, int]:
        async with _app(ApiSettings(token="user", control_token="control")) as http:
            body = {"models": []}
            as_user = await http.put(
                "/control/models", json=body, headers={"Authorization": "Bearer user"}
            )
            as_control = await http.put(
                "/control/models", json=body, headers={"Authorization": "bearer control"}
            )
            models = await http.get("/v1/models", headers={"Authorization": "Bearer control"})
            return as_user.status_code, as_control.status_code, models.status_code

    assert asyncio.run(go()) == (401, 200, 401)


class Reviewer:
    def __init__(self, reviews: dict[str, Review]) -> None:
        self.reviews = reviews
        self.calls = 0
        self.down = False

    def __call__(self, token: str, audiences: list[str]) -> Review:
        self.calls += 1
        if self.down:
            raise ClusterUnavailable("review a bearer token: connection refused")
        return self.reviews.get(token, Review(authenticated=False, error="invalid token"))


REVIEWS = {
    "ctl": Review(True, CONTROLLER, "", ("gw",)),
    "a1": Review(True, AGENT, "n1", ("gw",)),
    "a2": Review(True, AGENT, "n2", ("gw",)),
    "unbound": Review(True, AGENT, "", ("gw",)),
    "other": Review(True, "system:serviceaccount:x:y", "n1", ("gw",)),
    "api-aud": Review(False, error="token audiences [api] is invalid for the target audiences"),
}


def _auth(reviewer: Reviewer, clock: list[float] | None = None) -> ServiceAccountAuth:
    now = clock or [0.0]
    return ServiceAccountAuth(
        node="n1", reviewer=reviewer, audience="gw", controller=CONTROLLER, agent=AGENT,
        clock=lambda: now[0],
    )  # fmt: skip


@pytest.mark.parametrize(
    ("token", "scope", "status"),
    [
        ("ctl", "control", None),
        ("a1", "control", None),
        ("a2", "control", 403),
        ("a2", "forward", None),
        ("unbound", "control", 403),
        ("unbound", "forward", 403),
        ("other", "control", 403),
        ("api-aud", "control", 401),
        ("junk", "forward", 401),
    ],
)
def test_identity_rules(token: str, scope: str, status: int | None) -> None:
    auth = _auth(Reviewer(REVIEWS))

    async def go() -> int | None:
        try:
            await auth.authorize(token, scope)  # type: ignore[arg-type]
        except Denied as exc:
            return exc.status_code
        return None

    assert asyncio.run(go()) == status


def test_reviews_are_cached_briefly() -> None:
    reviewer = Reviewer(REVIEWS)
    clock = [0.0]
    auth = _auth(reviewer, clock)

    async def twice(token: str) -> None:
        for _ in range(2):
            with contextlib.suppress(Denied):
                await auth.authorize(token, "control")

    asyncio.run(twice("ctl"))
    asyncio.run(twice("junk"))
    assert reviewer.calls == 2  # one review per token
    clock[0] = auth.denied_ttl_s + 0.1
    asyncio.run(twice("junk"))
    asyncio.run(twice("ctl"))
    assert reviewer.calls == 3  # the refusal expired, the acceptance not yet
    clock[0] = auth.ttl_s + 0.1
    asyncio.run(twice("ctl"))
    assert reviewer.calls == 4


def test_an_unreachable_api_server_is_a_503_not_an_open_door() -> None:
    reviewer = Reviewer(REVIEWS)
    reviewer.down = True
    with pytest.raises(Denied) as denied:
        asyncio.run(_auth(reviewer).authorize("ctl", "control"))
    assert denied.value.status_code == 503


@pytest.mark.parametrize(
    ("user", "control"), [("same", "same"), ("same", " same\n")], ids=["equal", "equal-stripped"]
)
def test_the_same_token_for_users_and_control_is_refused(user: str, control: str) -> None:
    with pytest.raises(ConfigError, match="the same"):
        ApiSettings(token=user, control_token=control)


def test_a_refused_token_is_told_no_more_than_refused(caplog: pytest.LogCaptureFixture) -> None:
    """The API server's reason (the token's audiences) goes to the log, not to the caller."""
    with (
        pytest.raises(Denied) as denied,
        caplog.at_level("WARNING", logger="lmedge.dataplane.auth"),
    ):
        asyncio.run(_auth(Reviewer(REVIEWS)).authorize("api-aud", "control"))
    assert denied.value.status_code == 401
    assert "audience" not in str(denied.value.detail)
    assert any("token audiences [api]" in r.getMessage() for r in caplog.records)
