"""Engine telemetry: parsing llama.cpp and vLLM /metrics pages, rates from counters,
the scraper against mocked pods, and old telemetry documents still reading."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from lmedge.api.engine_telemetry import EngineCounters, engine_telemetry, kv_usage
from lmedge.api.observations import NodeState
from lmedge.api.records import NodeTelemetry
from lmedge.nodeagent.engines import engine_counters, slots_kv_usage, slots_url
from lmedge.nodeagent.telemetry import EngineScraper, EngineTarget

PAGES = Path(__file__).resolve().parents[2] / "fixtures" / "engines"


def page(name: str) -> str:
    return (PAGES / name).read_text()


@pytest.mark.parametrize(
    ("name", "kv", "running", "waiting", "prompt", "generated"),
    [
        ("llamacpp.txt", None, 3, 2, 1200.0, 3000.0),
        ("llamacpp-kv.txt", 0.625, 1, 0, 500.0, 900.0),
        ("vllm.txt", 0.83, 8, 4, 12000.0, 48000.0),
        ("vllm-v0.txt", 0.97, 2, 7, 300.0, 600.0),
    ],
    ids=["llama.cpp-0.3.36", "llama.cpp-with-kv-gauge", "vllm-v1-two-ranks", "vllm-v0"],
)
def test_each_engine_page_reads_into_counters(
    name: str, kv: float | None, running: int, waiting: int, prompt: float, generated: float
) -> None:
    c = engine_counters(page(name), "lm1", pod="lm1-w1-abc123", time_s=60.0)
    assert c == EngineCounters(
        lm="lm1",
        pod="lm1-w1-abc123",
        time_s=60.0,
        kv_cache_usage=kv,
        running=running,
        waiting=waiting,
        prompt_tokens_total=prompt,
        generation_tokens_total=generated,
    )


def test_a_pipeline_pods_page_is_no_engine_page() -> None:
    text = '# TYPE lmedge_model_prompts counter\nlmedge_model_prompts_total{lm="lm1"} 4.0\n'
    assert engine_counters(text, "lm1", pod="p", time_s=0.0) is None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("vllm:num_requests_running{ 5\n", "Prometheus text format"),
        ("vllm:num_requests_running five\n", "Prometheus text format"),
        (
            page("vllm.txt").replace("vllm:num_requests_waiting{", "vllm:other{"),
            "num_requests_waiting",
        ),
        ("llamacpp:requests_processing NaN\n", "not a finite number"),
        (page("llamacpp.txt").replace("requests_deferred 2", "requests_deferred -1"), "waiting"),
    ],
    ids=["broken-labels", "not-a-number", "missing-gauge", "nan", "negative"],
)
def test_a_malformed_page_is_a_value_error_that_says_why(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        engine_counters(text, "lm1", pod="p", time_s=0.0)


def reading(t: float, prompt: float, generated: float, kv: float | None = 0.5) -> EngineCounters:
    return EngineCounters(
        lm="lm1",
        time_s=t,
        kv_cache_usage=kv,
        running=2,
        waiting=1,
        prompt_tokens_total=prompt,
        generation_tokens_total=generated,
    )


@pytest.mark.parametrize(
    ("before", "now", "prompt_rate", "generation_rate"),
    [
        (None, reading(30, 100, 200), None, None),
        (reading(0, 100, 200), reading(30, 400, 1100), 10.0, 30.0),
        (reading(0, 900, 900), reading(30, 300, 600), 10.0, 20.0),
        (reading(30, 100, 200), reading(30, 400, 1100), None, None),
    ],
    ids=["first-reading", "growth-over-interval", "counter-reset", "no-time-passed"],
)
def test_throughput_is_counter_growth_over_the_interval(
    before: EngineCounters | None,
    now: EngineCounters,
    prompt_rate: float | None,
    generation_rate: float | None,
) -> None:
    t = engine_telemetry(now, before)
    assert (t.prompt_tokens_per_s, t.generation_tokens_per_s) == (prompt_rate, generation_rate)
    assert (t.kv_cache_usage, t.running, t.waiting) == (0.5, 2, 1)


def test_node_kv_usage_is_max_and_mean_over_pods_that_report_it() -> None:
    engines = [
        engine_telemetry(reading(0, 0, 0, kv), None).model_copy(update={"lm": lm})
        for lm, kv in (("a", 0.2), ("b", 0.8), ("c", None))
    ]
    assert kv_usage(engines) == pytest.approx((0.8, 0.5))
    snap = NodeTelemetry(node="w1", time_s=0, cpu_util=0, memory_util=0, engines=engines)
    assert (snap.kv_usage_max, snap.kv_usage_mean) == pytest.approx((0.8, 0.5))
    assert kv_usage(engines[2:]) is None and kv_usage(None) is None


def test_documents_without_engines_still_read() -> None:
    old = {"node": "w1", "time_s": 3.0, "cpu_util": 0.1, "memory_util": 0.2}
    snap = NodeTelemetry.model_validate(old)
    assert snap.engines is None and snap.kv_usage_max is None
    assert NodeState.model_validate({"name": "w1"}).engines is None


def test_the_scraper_reads_engine_pods_and_leaves_out_what_it_cannot() -> None:
    pages = {
        "/vllm/metrics": page("vllm.txt"),
        "/pipeline/metrics": 'lmedge_model_prompts_total{lm="lm2"} 4.0\n',
        "/broken/metrics": "vllm:num_requests_running{ 5\n",
    }

    def answer(request: httpx.Request) -> httpx.Response:
        text = pages.get(request.url.path)
        return httpx.Response(200, text=text) if text else httpx.Response(503)

    times = iter([30.0, 60.0, 90.0])
    scraper = EngineScraper(clock=lambda: next(times), transport=httpx.MockTransport(answer))
    targets = [
        EngineTarget(lm, f"{lm}-pod", f"http://10.0.0.1:8000/{path}/metrics")
        for lm, path in (("lm1", "vllm"), ("lm2", "pipeline"), ("lm3", "broken"), ("lm4", "down"))
    ]
    (first,) = asyncio.run(scraper.scrape(targets)) or []
    assert (first.pod, first.kv_cache_usage, first.waiting) == ("lm1-pod", 0.83, 4)
    assert first.generation_tokens_per_s is None
    pages["/vllm/metrics"] = pages["/vllm/metrics"].replace("40000.0", "43000.0")
    (second,) = asyncio.run(scraper.scrape(targets)) or []
    assert second.generation_tokens_per_s == pytest.approx(100.0)
    assert asyncio.run(scraper.scrape([])) is None


def test_llamacpp_kv_usage_is_the_busy_slots_tokens_over_all_slots_context() -> None:
    # The real llama-server's /slots: slot 0 busy with 10 tokens, slot 1 idle
    # still caching 304 (not counted), 512 context each.
    assert slots_kv_usage(page("llamacpp-slots.json")) == pytest.approx(10 / 1024)
    c = engine_counters(
        page("llamacpp.txt"), "lm1", pod="p", time_s=0.0, slots=page("llamacpp-slots.json")
    )
    assert c is not None and c.kv_cache_usage == pytest.approx(10 / 1024)
    # a page with the gauge keeps it; /slots is only read where the page has none
    kv = engine_counters(page("llamacpp-kv.txt"), "lm1", pod="p", time_s=0.0, slots="[]")
    assert kv is not None and kv.kv_cache_usage == 0.625


@pytest.mark.parametrize(
    ("name", "url"),
    [
        ("llamacpp.txt", "http://10.0.0.1:8080/slots"),
        ("llamacpp-kv.txt", None),
        ("vllm.txt", None),
    ],
    ids=["llama.cpp-without-gauge", "llama.cpp-with-gauge", "vllm"],
)
def test_only_a_page_without_kv_gauge_sends_the_scraper_to_slots(
    name: str, url: str | None
) -> None:
    assert slots_url(page(name), "http://10.0.0.1:8080/metrics") == url


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("not json", "not JSON"),
        ("{}", "list of slot objects"),
        ("[]", "list of slot objects"),
        ('[{"n_ctx": 512, "is_processing": true, "n_prompt_tokens": -1}]', "n_prompt_tokens"),
        ('[{"is_processing": false}]', "n_ctx"),
    ],
    ids=["not-json", "object", "empty", "negative-tokens", "no-n-ctx"],
)
def test_a_malformed_slots_page_is_a_value_error_naming_it(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        slots_kv_usage(text)


def test_the_scraper_reads_llamacpp_kv_usage_from_slots_beside_metrics() -> None:
    pages = {"/metrics": page("llamacpp.txt"), "/slots": page("llamacpp-slots.json")}
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        return httpx.Response(200, text=pages[request.url.path])

    scraper = EngineScraper(clock=lambda: 30.0, transport=httpx.MockTransport(answer))
    target = EngineTarget("lm1", "lm1-pod", "http://10.0.0.1:8080/metrics")
    (reading,) = asyncio.run(scraper.scrape([target])) or []
    assert reading.kv_cache_usage == pytest.approx(10 / 1024)
    assert sorted(asked) == ["/metrics", "/slots"]
    del pages["/slots"]  # slots off (--no-slots): no usage, the rest still read

    def no_slots(request: httpx.Request) -> httpx.Response:
        text = pages.get(request.url.path)
        return httpx.Response(200, text=text) if text else httpx.Response(501)

    scraper = EngineScraper(clock=lambda: 30.0, transport=httpx.MockTransport(no_slots))
    (reading,) = asyncio.run(scraper.scrape([target])) or []
    assert reading.kv_cache_usage is None and reading.running == 3


def test_the_scraper_reads_at_most_concurrency_pages_at_once() -> None:
    in_flight, most = 0, 0

    async def answer(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return httpx.Response(200, text=page("vllm.txt"))

    scraper = EngineScraper(concurrency=3, transport=httpx.MockTransport(answer))
    targets = [EngineTarget("lm1", f"p{i}", f"http://10.0.0.{i}:8000/metrics") for i in range(20)]
    assert len(asyncio.run(scraper.scrape(targets)) or []) == 20
    assert most == 3


def test_pages_not_in_within_the_budget_are_left_out_and_the_rest_kept() -> None:
    async def answer(request: httpx.Request) -> httpx.Response:
        if request.url.host == "10.0.0.9":
            await asyncio.sleep(30)  # silent far beyond the budget
        return httpx.Response(200, text=page("vllm.txt"))

    scraper = EngineScraper(budget_s=0.5, transport=httpx.MockTransport(answer))
    targets = [EngineTarget("lm1", f"p{i}", f"http://10.0.0.{i}:8000/metrics") for i in range(10)]
    read = asyncio.run(scraper.scrape(targets)) or []
    assert sorted(t.pod for t in read) == [f"p{i}" for i in range(9)]


def test_only_the_read_quantities_are_parsed_so_other_metrics_may_be_anything() -> None:
    text = page("vllm.txt") + 'vllm:time_to_first_token_seconds_bucket{le="0.1"} 3\nweird{ line\n'
    c = engine_counters(text, "lm1", pod="p", time_s=0.0)
    assert c is not None and (c.running, c.waiting, c.kv_cache_usage) == (8, 4, 0.83)
