"""LYREO's learned scheduler: parameters, policy files, the numpy actor, GAE and redistribution."""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path

import numpy as np
import pytest

from lmedge.api import SlotObservation, check_routing_map
from lmedge.backends.emulated import EmulatedBackend
from lmedge.errors import ConfigError
from lmedge.policies.kit.params import parse_params
from lmedge.policies.kit.requests import RequestSlot
from lmedge.policies.lyreo import LyreoRequestParams, LyreoRequestRouter, build_request_router
from lmedge.policies.lyreo.learned import build_learned
from lmedge.policies.lyreo.learning import (
    FEATURES,
    ActorLearner,
    LearnerParams,
    NumpyActor,
    PolicyFile,
    Provenance,
    load_policy,
    save_policy,
)
from lmedge.policies.lyreo.learning.actor import Layer
from lmedge.policies.lyreo.learning.features import greedy_scores, request_rows
from lmedge.policies.lyreo.perrequest import Terms
from lmedge.sim import load_scenario
from tests.unit.policies.lyapunov.scenario import slot_obs
from tests.unit.policies.lyreo.windows import window_of

ROOT = Path(__file__).resolve().parents[4]


def _policy(seed: int = 0, variant: str = "lyreo", hidden: int = 8) -> PolicyFile:
    rng = np.random.default_rng(seed)
    sizes = [len(FEATURES), hidden, hidden, 1]
    layers = [
        Layer(weight=rng.normal(size=(a, b)).tolist(), bias=rng.normal(size=b).tolist())
        for a, b in itertools.pairwise(sizes)
    ]
    return PolicyFile(
        variant=variant,  # type: ignore[arg-type]
        features=list(FEATURES),
        params=LearnerParams(variant=variant),  # type: ignore[arg-type]
        actor=layers,
        provenance=Provenance(
            scenario="t",
            seed=seed,
            episodes=0,
            selected=0,
            slots=1,
            commit="x",
            lmedge_version="0",
        ),
    )


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"horizon": 1}, "horizon"),
        ({"variant": "dqn"}, "variant"),
        ({"clip": 1.5}, "clip"),
        ({"gamma": 0}, "gamma"),
        ({"lstm_hidden": 0}, "lstm_hidden"),
        ({"fixed_penalty": 2.0}, "fixed_penalty"),
        ({"learning_rate": 0.1}, "learning_rate"),
    ],
    ids=["horizon", "variant", "clip", "gamma", "lstm", "penalty-without-ppo-fixed", "unknown"],
)
def test_bad_hyperparameters_are_refused_naming_the_field(
    given: dict[str, object], field: str
) -> None:
    with pytest.raises(ConfigError, match=field):
        parse_params(LearnerParams, given, "lmedge train lyreo")


def test_fixed_penalty_is_accepted_for_ppo_fixed() -> None:
    p = parse_params(LearnerParams, {"variant": "ppo-fixed", "fixed_penalty": 2}, "t")
    assert p.fixed_penalty == 2.0


def test_policy_file_round_trips(tmp_path: Path) -> None:
    policy = _policy()
    save_policy(policy, tmp_path / "p.json")
    assert load_policy(tmp_path / "p.json") == policy


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("layers", "3 layers"),
        ("{", "not JSON"),
        ('{"format": "lmedge-lyreo-policy/2"}', "variant"),
        ("format-1", "format"),
        ("features", "retrain"),
    ],
    ids=["missing", "two-layers", "not-json", "incomplete", "format-1", "other-features"],
)
def test_bad_policy_files_are_refused_clearly(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "p.json"
    if content == "features":
        raw = _policy().model_dump(mode="json")
        raw["features"] = [f"other-{k}" for k in range(len(FEATURES))]
        content = json.dumps(raw)
    if content == "format-1":  # an actor trained before residual actors existed
        raw = _policy().model_dump(mode="json")
        raw["format"] = "lmedge-lyreo-policy/1"
        content = json.dumps(raw)
    if content == "layers":
        raw = _policy().model_dump(mode="json")
        raw["actor"] = raw["actor"][:2]
        content = json.dumps(raw)
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_policy(path)


def test_numpy_actor_matches_the_torch_actor() -> None:
    torch = pytest.importorskip("torch")
    from lmedge.policies.lyreo.learning.ppo import ActorCritic

    net = ActorCritic(16)
    with torch.no_grad():
        for m in net.actor:
            if isinstance(m, torch.nn.Linear):
                m.weight.normal_()
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(7, len(FEATURES))).astype(np.float32)
    prior = rng.normal(scale=10, size=7).astype(np.float32)
    mask = torch.ones(1, 7, dtype=torch.bool)
    want = net.logits(torch.from_numpy(rows)[None], mask, torch.from_numpy(prior)[None])
    got = NumpyActor([(np.array(x.weight), np.array(x.bias)) for x in net.numpy_layers()])
    assert got.logits(rows) + prior == pytest.approx(want[0].detach().numpy(), rel=1e-4, abs=1e-4)


def test_validation_seeds_read_from_a_param_value() -> None:
    p = parse_params(LearnerParams, {"validate_seeds": "11, 12,13"}, "t")
    assert p.validate_seeds == (11, 12, 13)
    with pytest.raises(ConfigError, match="validate_seeds"):
        parse_params(LearnerParams, {"validate_seeds": "11,x"}, "t")


def _zero_last_layer(policy: PolicyFile) -> PolicyFile:
    last = policy.actor[-1]
    zero = Layer(weight=[[0.0] for _ in last.weight], bias=[0.0])
    return policy.model_copy(update={"actor": [*policy.actor[:-1], zero]})


@pytest.mark.parametrize("mix", ["", "heterogeneous"], ids=["moderate", "heterogeneous"])
def test_an_untrained_residual_actor_routes_as_lyreo_ly(mix: str) -> None:
    obs = _lyreo_slot(mix)
    # virtual queues away from zero, so that the balance term takes part in every choice
    z = {n.name: 0.05 * (k % 3) for k, n in enumerate(obs.context.workers)}
    greedy = build_request_router("lyreo-ly", {})
    learned = LyreoRequestRouter(
        "lyreo", LyreoRequestParams(), ActorLearner(_zero_last_layer(_policy()))
    )
    greedy.z, learned.z = dict(z), dict(z)
    window = window_of(obs)
    want = [r.destination for r in greedy.route_requests(window)]
    got = [r.destination for r in learned.route_requests(window)]
    assert len(set(want)) > 1  # the slot spreads: the check is not trivial
    assert got == want


def test_the_fixed_penalty_greedy_score_by_hand() -> None:
    terms = Terms(
        latency=[3.0, 6.0], balance=[9.0, 9.0], loads=[0.04, 0.02], z=[1.0, 1.0], epsilon=0.01
    )
    p = LearnerParams(variant="ppo-fixed", fixed_penalty=2.0, nu=0.5)
    # nu lat / deadline + penalty (W - mean W); the balance (from Z) is ignored
    assert greedy_scores(terms, 30.0, p) == pytest.approx([0.05 + 0.02, 0.1 - 0.02])
    assert greedy_scores(terms, 30.0, LearnerParams()) == pytest.approx([9.05, 9.1])


def test_gae_by_hand() -> None:
    pytest.importorskip("torch")
    from lmedge.policies.lyreo.learning.ppo import gae

    r, v = np.array([1.0, 0.0, 2.0]), np.array([0.5, 0.5, 0.5, 9.0])
    ends = np.array([False, True, True])
    adv = gae(r, v, ends, gamma=0.9, lam=0.5)
    d2 = 2.0 - 0.5  # terminal: the 9.0 after it is not bootstrapped
    d1 = 0.0 - 0.5  # terminal too
    d0 = 1.0 + 0.9 * 0.5 - 0.5
    assert adv == pytest.approx([d0 + 0.45 * d1, d1, d2])


def test_redistribution_keeps_each_windows_return() -> None:
    pytest.importorskip("torch")
    from lmedge.policies.lyreo.learning.ppo import Trainer
    from lmedge.policies.lyreo.learning.rollout import Trajectory

    n, h = 23, 10
    rng = np.random.default_rng(3)
    traj = Trajectory(
        rows=rng.normal(size=(n, 4, len(FEATURES))).astype(np.float32),
        mask=np.ones((n, 4), dtype=bool),
        prior=np.zeros((n, 4), dtype=np.float32),
        actions=rng.integers(0, 4, size=n),
        logp=np.zeros(n, dtype=np.float32),
        observed_cost=rng.random(n),
        true_cost=rng.random(n),
    )
    params = LearnerParams(horizon=h, gamma=1.0, predictor_epochs=2)
    trainer = Trainer(params, 0)
    rewards, values = -traj.observed_cost, rng.normal(size=n)
    out = trainer.redistribute(traj, rewards, values)
    for s in range(0, n, h):
        e = min(s + h, n)
        boot = values[e] if e < n else 0.0
        assert out[s:e].sum() == pytest.approx(rewards[s:e].sum() + boot)


def _lyreo_slot(mix: str = "") -> SlotObservation:
    """Slot 0 of examples/lyreo (`mix`: a subdirectory), every server running the LM."""
    scenario = load_scenario(ROOT / "examples" / "lyreo" / mix)
    backend = EmulatedBackend(scenario, seed=1)
    ctx = backend.context()
    running = {n.name: {lm: "gpu" for lm in ctx.lm_names} for n in ctx.workers}
    obs = slot_obs([], running=running, ctx=ctx, slot=0)
    return obs.model_copy(update={"arrivals": backend.arrivals(0)})


@pytest.mark.parametrize("servers", [8, 3, 1], ids=["8", "3", "1"])
def test_a_policy_decides_on_any_number_of_servers(servers: int) -> None:
    obs = _lyreo_slot()
    slot = RequestSlot(obs.context, obs, obs.context.lm_names[0])
    slot.servers = slot.servers[:servers]
    router = LyreoRequestRouter("lyreo", LyreoRequestParams(), ActorLearner(_policy()))
    terms = router.terms(slot, 70)
    rows = request_rows(slot, 70, terms, slot.deadline_s, True)
    assert rows.shape == (servers, len(FEATURES))
    assert 0 <= router.learner.decide(slot, obs.arrivals[0], 70, terms) < servers  # type: ignore[union-attr]


def test_the_learned_router_routes_every_request() -> None:
    obs = _lyreo_slot("heterogeneous")
    router = LyreoRequestRouter("lyreo", LyreoRequestParams(), ActorLearner(_policy()))
    routes = router.route_requests(window_of(obs))
    assert [(r.origin, r.lm) for r in routes] == [(a.origin, a.lm) for a in obs.arrivals]
    assert all(r.destination in obs.context.feasible_nodes(r.lm) for r in routes)
    assert check_routing_map(router.route(obs).value, obs.context, obs.arrivals) == []


def test_the_actor_decides_not_the_greedy() -> None:
    obs = _lyreo_slot()
    first = obs.model_copy(update={"arrivals": obs.arrivals[:1]})
    greedy = build_request_router("lyreo-ly", {}).route_requests(window_of(first))[0].destination
    assert "4090" in greedy  # an idle cluster: the fastest server
    # an actor (not residual) that only reads the `prefill_rate` column, against it: the slowest
    layers = [
        Layer(weight=[[-1.0 if f == "prefill_rate" else 0.0] for f in FEATURES], bias=[0.0]),
        Layer(weight=[[1.0]], bias=[0.0]),
        Layer(weight=[[1.0]], bias=[0.0]),
    ]
    params = LearnerParams(residual=False)
    policy = _policy().model_copy(update={"actor": layers, "params": params})
    learned = LyreoRequestRouter("lyreo", LyreoRequestParams(), ActorLearner(policy))
    assert "3080" in learned.route_requests(window_of(first))[0].destination


def test_missing_shipped_policy_falls_back_to_the_greedy_and_says_so(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from lmedge.policies.lyreo import learned

    monkeypatch.setattr(learned, "shipped_policy", lambda v: tmp_path / f"{v}.json")
    monkeypatch.setattr(learned, "_told", set())
    with caplog.at_level(logging.WARNING):
        router = build_learned({}, "ly-ppo")
    assert router.learner is None
    assert "no trained policy" in caplog.text and "lmedge train lyreo" in caplog.text


def test_a_policy_file_parameter_is_loaded(tmp_path: Path) -> None:
    save_policy(_policy(), tmp_path / "p.json")
    router = build_learned({"policy": str(tmp_path / "p.json")}, "lyreo")
    assert isinstance(router.learner, ActorLearner)
    assert build_learned({"policy": "none"}, "lyreo").learner is None
    with pytest.raises(ConfigError, match="cannot read"):
        build_learned({"policy": str(tmp_path / "nope.json")}, "lyreo")
