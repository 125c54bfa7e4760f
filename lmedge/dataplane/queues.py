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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from lmedge.api.inference import InferRequest, InferResult
from lmedge.dataplane.wire import ForwardRequest, ForwardResult
from lmedge.errors import ModelFailed, ModelUnavailable

__all__ = [
    "LMQueues",
    "LocalModels",
    "ModelCaller",
    "ModelFailed",
    "ModelUnavailable",
]

log = logging.getLogger(__name__)


class ModelCaller(Protocol):
    """Calls a model server's `/infer` (the httpx client in production)."""

    async def infer(self, url: str, request: InferRequest, timeout_s: float) -> InferResult: ...


class LocalModels:
    """LM -> model-server URL for the pods now serving on this node.

    An LM is *active* here exactly when it has a URL. Waiters are woken when
    the set changes.
    """

    def __init__(self, urls: dict[str, str] | None = None) -> None:
        self._urls: dict[str, str] = dict(urls or {})
        self._changed = asyncio.Event()

    def replace(self, urls: dict[str, str]) -> None:
        self._urls = dict(urls)
        # Wake every waiter; each re-checks its own LM.
        self._changed.set()
        self._changed = asyncio.Event()

    def url(self, lm: str) -> str | None:
        return self._urls.get(lm)

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


@dataclass
class LMQueues:
    """Per-LM FIFO queues of this node, each drained by one worker task.

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
    _queues: dict[str, asyncio.Queue[_Job]] = field(default_factory=dict)
    _workers: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    def depth(self) -> dict[str, int]:
        """Sets waiting per LM (not counting the one running)."""
        return {lm: q.qsize() for lm, q in self._queues.items()}

    async def submit(self, request: ForwardRequest) -> ForwardResult:
        """Queue a set that arrived here and wait for its result."""
        loop = asyncio.get_running_loop()
        job = _Job(
            request=request,
            arrived=self.monotonic(),
            received_at=self.wall(),
            conflict=self.models.url(request.lm) is None,
            future=loop.create_future(),
        )
        queue = self._queues.get(request.lm)
        if queue is None:
            queue = self._queues[request.lm] = asyncio.Queue()
            self._workers[request.lm] = asyncio.create_task(
                self._drain(request.lm, queue), name=f"lm-queue-{request.lm}"
            )
        queue.put_nowait(job)
        self._report(request.lm)
        return await job.future

    async def close(self) -> None:
        """Stop the workers; sets still queued are answered as failed."""
        for task in self._workers.values():
            task.cancel()
        for task in self._workers.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for queue in self._queues.values():
            while not queue.empty():
                job = queue.get_nowait()
                if not job.future.done():
                    job.future.set_result(self._failed(job, "gateway shutting down"))
        self._workers.clear()

    # -- worker -------------------------------------------------------------------

    async def _drain(self, lm: str, queue: asyncio.Queue[_Job]) -> None:
        while True:
            job = await queue.get()
            self._report(lm)
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
                answer = await self.caller.infer(url, call, left + self.grace_s)
            except ModelUnavailable as exc:
                log.debug("model %s at %s not available: %s", req.lm, url, exc)
                await asyncio.sleep(min(self.retry_interval_s, max(left, 0.0)))
                continue
            except ModelFailed as exc:
                return self._failed(job, f"model server for {req.lm} failed: {exc}")
            return self._finish(job, answer)

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
