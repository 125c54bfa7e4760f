"""The destination side: one FIFO queue per LM feeding this node's model pod.

A model pod serves one prompt set at a time (one LM per pod, paper §V-B), so
each LM has one queue and one worker task that takes the oldest set, waits
until the LM is active here (a pod is registered: that wait is the cold start
and counts as queueing), calls the pod, and resolves the set's future.

Deadline: every set carries the time left until tau. A set whose deadline has
passed when it reaches the head of its queue is answered `timeout` without
running; a running set passes the time left to the model server, which starts
no prompt after it, so partial results come back with the prompts finished.

Pod restarts: an unreachable or not-yet-ready pod is retried with the same set
id until the deadline; the model server resumes at the first unfinished prompt.

Streams (`lease`) wait in the same FIFO queue as sets: at the head, once the
LM is active, the worker hands the stream a `PodLease` (the pod's URL and
protocol) and waits until the stream releases it (it ended, failed, or its
client left), so a pod still serves one request at a time. A stream whose
client left while it was queued is skipped when its turn comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from lmedge.api.gateway_control import PodProtocol
from lmedge.api.inference import InferRequest, InferResult, Output
from lmedge.dataplane.engines import EngineCall, Finish, Piece, PodStreamProtocol, pod_protocol
from lmedge.dataplane.wire import ForwardRequest, ForwardResult, StreamForward
from lmedge.errors import BadRequest, ModelFailed, ModelUnavailable

__all__ = [
    "LMQueues",
    "LocalModels",
    "ModelCaller",
    "ModelFailed",
    "ModelUnavailable",
    "PodLease",
]

log = logging.getLogger(__name__)

#: The `mode` recorded for work on an OpenAI-speaking engine, which does not say
#: whether it runs on a GPU: the engines lmedge deploys (llama.cpp, vLLM) are
#: scheduled onto GPUs.
ENGINE_MODE: Literal["gpu"] = "gpu"


class ModelCaller(Protocol):
    """Calls a model pod (the httpx client in production): `/infer` for a set, and
    one prompt streamed through the pod's protocol adapter."""

    async def infer(self, url: str, request: InferRequest, timeout_s: float) -> InferResult: ...

    def stream_pod(
        self, url: str, protocol: PodStreamProtocol, call: EngineCall, timeout_s: float
    ) -> AsyncGenerator[Piece | Finish, None]:
        """Pieces, then a `Finish`; `ModelUnavailable` / `BadRequest` / `ModelFailed`."""
        ...


class LocalModels:
    """LM -> model-server URL for the pods now serving on this node.

    An LM is *active* here exactly when it has a URL. Waiters are woken when
    the set changes. Each pod speaks a protocol (`pipeline` unless registered
    otherwise).
    """

    def __init__(self, urls: dict[str, str] | None = None) -> None:
        self._urls: dict[str, str] = dict(urls or {})
        self._protocols: dict[str, PodProtocol] = {}
        self._concurrency: dict[str, int] = {}
        self._changed = asyncio.Event()

    def replace(
        self,
        urls: dict[str, str],
        protocols: dict[str, PodProtocol] | None = None,
        concurrency: dict[str, int] | None = None,
    ) -> None:
        """Serve `urls` from now on; `protocols` / `concurrency` None keep each kept LM's."""
        kept = self._protocols if protocols is None else protocols
        at_once = self._concurrency if concurrency is None else concurrency
        self._urls = dict(urls)
        self._protocols = {lm: p for lm, p in kept.items() if lm in urls}
        self._concurrency = {lm: n for lm, n in at_once.items() if lm in urls}
        # Wake every waiter; each re-checks its own LM.
        self._changed.set()
        self._changed = asyncio.Event()

    def url(self, lm: str) -> str | None:
        return self._urls.get(lm)

    def protocol(self, lm: str) -> PodProtocol:
        return self._protocols.get(lm, "pipeline")

    def concurrency(self, lm: str) -> int:
        """Requests `lm`'s pod serves at once (1 unless registered otherwise)."""
        return self._concurrency.get(lm, 1)

    def active(self) -> list[str]:
        return sorted(self._urls)

    async def wait_changed(self, timeout_s: float) -> None:
        """Return when the set changes or after `timeout_s`, whichever is first."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout_s)


@dataclass
class _Job:
    request: ForwardRequest
    arrived: float
    received_at: float
    conflict: bool
    future: asyncio.Future[ForwardResult]

    @property
    def deadline(self) -> float:
        return self.arrived + self.request.budget_s


@dataclass(frozen=True)
class PodLease:
    """A stream's turn on its LM's pod: where the pod is, and what the queue took.

    `release` must be called when the stream is over (idempotent).
    """

    url: str
    protocol: PodProtocol
    received_at: float
    queue_s: float
    conflict: bool
    release: Callable[[], None]


@dataclass
class _StreamJob:
    request: StreamForward
    arrived: float
    received_at: float
    conflict: bool
    future: asyncio.Future[PodLease | None]
    released: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def deadline(self) -> float:
        return self.arrived + self.request.budget_s


@dataclass
class LMQueues:
    """Per-LM FIFO queues of this node, each drained by as many worker tasks as its
    pod serves requests at once (`LocalModels.concurrency`: 1 for a pipeline pod).

    `retry_interval_s`: wait between calls to a pod that is unreachable or not
    ready, seconds (default 0.25: a cold start takes ~10 s, so this adds at
    most a few percent). `grace_s`: how much longer than the time left the HTTP
    call may take, so the server can return its partial result (default 2 s).
    """

    node: str
    models: LocalModels
    caller: ModelCaller
    retry_interval_s: float = 0.25
    grace_s: float = 2.0
    monotonic: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    on_depth: Callable[[str, int], None] | None = None
    _queues: dict[str, asyncio.Queue[_Job | _StreamJob]] = field(default_factory=dict)
    _workers: dict[str, list[asyncio.Task[None]]] = field(default_factory=dict)

    def depth(self) -> dict[str, int]:
        """Sets waiting per LM (not counting those running)."""
        return {lm: q.qsize() for lm, q in self._queues.items()}

    def _arrival(self, lm: str) -> tuple[float, float, bool, asyncio.Future[Any]]:
        """What every queued job starts with: arrival (monotonic and wall), whether its LM
        has no pod here (a conflict), and the future its result is set on."""
        conflict = self.models.url(lm) is None
        return self.monotonic(), self.wall(), conflict, asyncio.get_running_loop().create_future()

    async def submit(self, request: ForwardRequest) -> ForwardResult:
        """Queue a set that arrived here and wait for its result."""
        job = _Job(request, *self._arrival(request.lm))
        self._enqueue(job)
        return await job.future

    async def lease(self, request: StreamForward) -> PodLease | None:
        """Queue a stream for its LM's pod; its lease when its turn comes, None if its
        deadline passed first. Cancelling the wait (the client left) gives up its place."""
        job = _StreamJob(request, *self._arrival(request.lm))
        self._enqueue(job)
        try:
            return await job.future
        except asyncio.CancelledError:
            # Granted just as the waiter was cancelled: hand the pod back.
            if job.future.done() and not job.future.cancelled() and job.future.result():
                job.released.set()
            raise

    def _enqueue(self, job: _Job | _StreamJob) -> None:
        lm = job.request.lm
        queue = self._queues.get(lm)
        if queue is None:
            queue = self._queues[lm] = asyncio.Queue()
        # One worker per request the pod serves at once (an engine batches them).
        workers = self._workers.setdefault(lm, [])
        workers[:] = [w for w in workers if not w.done()]
        while len(workers) < self.models.concurrency(lm):
            n = len(workers)
            workers.append(
                asyncio.create_task(self._drain(lm, queue, n), name=f"lm-queue-{lm}-{n}")
            )
        queue.put_nowait(job)
        self._report(lm)

    async def close(self) -> None:
        """Stop the workers; sets still queued are answered as failed."""
        tasks = [task for workers in self._workers.values() for task in workers]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for queue in self._queues.values():
            while not queue.empty():
                job = queue.get_nowait()
                if isinstance(job, _StreamJob):
                    if not job.future.done():
                        job.future.set_result(None)
                elif not job.future.done():
                    job.future.set_result(self._failed(job, "gateway shutting down"))
        self._workers.clear()

    # -- worker -------------------------------------------------------------------

    async def _drain(self, lm: str, queue: asyncio.Queue[_Job | _StreamJob], n: int) -> None:
        """Worker `n` of `lm`: runs its queue's jobs one at a time while the pod takes
        more than `n` at once (it ends when a new pod takes fewer)."""
        while n < self.models.concurrency(lm):
            job = await queue.get()
            self._report(lm)
            if isinstance(job, _StreamJob):
                await self._hand_over(job)
                continue
            try:
                result = await self._run(job)
            except asyncio.CancelledError:
                if not job.future.done():
                    job.future.set_result(self._failed(job, "gateway shutting down"))
                raise
            except Exception as exc:  # one bad set must not stop the LM's queue
                log.exception("set %s on %s failed", job.request.id, lm)
                result = self._failed(job, f"gateway error: {exc}")
            if not job.future.done():
                job.future.set_result(result)

    async def _run(self, job: _Job) -> ForwardResult:
        req = job.request
        while True:
            left = job.deadline - self.monotonic()
            if left <= 0:
                return self._finish(job, None)
            url = self.models.url(req.lm)
            if url is None:
                await self.models.wait_changed(left)
                continue
            call = InferRequest(id=req.id, lm=req.lm, prompts=req.prompts, budget_s=left)
            try:
                if self.models.protocol(req.lm) == "openai":
                    answer = await self._run_on_engine(url, call, left)
                else:
                    answer = await self.caller.infer(url, call, left + self.grace_s)
            except ModelUnavailable as exc:
                log.debug("model %s at %s not available: %s", req.lm, url, exc)
                await asyncio.sleep(min(self.retry_interval_s, max(left, 0.0)))
                continue
            except (ModelFailed, BadRequest) as exc:
                return self._failed(job, f"model server for {req.lm} failed: {exc}")
            return self._finish(job, answer)

    async def _run_on_engine(self, url: str, call: InferRequest, left: float) -> InferResult:
        """A set on an OpenAI-speaking engine: its prompts one by one, each a completion
        streamed and joined (no chat template: a set's prompts are plain text); no
        prompt starts after the budget, as on a model server."""
        began = self.monotonic()
        outputs: list[Output] = []
        for index, prompt in enumerate(call.prompts):
            spent = self.monotonic() - began
            if spent >= left:
                break
            one = EngineCall(id=f"{call.id}-{index}", lm=call.lm, prompt=prompt)
            pieces: list[str] = []
            finish = Finish()
            stream = self.caller.stream_pod(
                url, pod_protocol("openai"), one, left - spent + self.grace_s
            )
            async for item in stream:
                if isinstance(item, Finish):
                    finish = item
                else:
                    pieces.append(item.text)
            outputs.append(
                Output(
                    text="".join(pieces),
                    prompt_tokens=finish.prompt_tokens,
                    completion_tokens=finish.completion_tokens,
                )
            )
        return InferResult(
            id=call.id,
            lm=call.lm,
            outputs=outputs,
            complete=len(outputs) == len(call.prompts),
            inference_s=self.monotonic() - began,
            mode=ENGINE_MODE,
        )

    async def _hand_over(self, job: _StreamJob) -> None:
        """Give a stream its pod when the LM is active, and wait for it to be released."""
        lm = job.request.lm
        try:
            while not job.future.done():  # done: the client left while queued
                left = job.deadline - self.monotonic()
                url = self.models.url(lm)
                if left <= 0:
                    job.future.set_result(None)
                elif url is None:
                    await self.models.wait_changed(left)
                else:
                    job.future.set_result(
                        PodLease(
                            url=url,
                            protocol=self.models.protocol(lm),
                            received_at=job.received_at,
                            queue_s=max(self.monotonic() - job.arrived, 0.0),
                            conflict=job.conflict,
                            release=job.released.set,
                        )
                    )
                    # The stream's own deadline ends it; the bound only guards the queue.
                    bound = max(job.deadline - self.monotonic(), 0.0) + self.grace_s
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(job.released.wait(), bound)
        except asyncio.CancelledError:
            if not job.future.done():
                job.future.set_result(None)
            raise

    def _finish(self, job: _Job, answer: InferResult | None) -> ForwardResult:
        elapsed = self.monotonic() - job.arrived
        inference = answer.inference_s if answer else 0.0
        complete = answer is not None and answer.complete and elapsed <= job.request.budget_s
        return ForwardResult(
            id=job.request.id,
            destination=self.node,
            received_at=job.received_at,
            queue_s=max(elapsed - inference, 0.0),
            inference_s=inference,
            outcome="success" if complete else "timeout",
            conflict=job.conflict,
            mode=answer.mode if answer else "none",
            outputs=list(answer.outputs) if answer else [],
        )

    def _failed(self, job: _Job, error: str) -> ForwardResult:
        return ForwardResult(
            id=job.request.id,
            destination=self.node,
            received_at=job.received_at,
            queue_s=max(self.monotonic() - job.arrived, 0.0),
            inference_s=0.0,
            outcome="timeout",
            conflict=job.conflict,
            mode="none",
            outputs=[],
            error=error,
        )

    def _report(self, lm: str) -> None:
        if self.on_depth is not None:
            self.on_depth(lm, self._queues[lm].qsize())
