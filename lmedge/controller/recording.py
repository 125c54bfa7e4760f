"""The control loop's writes to the store: a slot's requests, decisions and telemetry.

Queued slot by slot and sent every `store_every` slots as a few batch
inserts (1 on a cluster, more in the emulator where slots take
milliseconds), or sooner once `MAX_UNSENT_RECORDS` request records wait.
A store write never stops the loop: what it raises is logged with what
was lost. What the loop keeps in memory (`RunResult`) and the
epochs' metrics stay with the loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from lmedge.api import Decision, NodeTelemetry, RequestRecord
from lmedge.store import Store

log = logging.getLogger(__name__)

#: Request records queued before they are sent, whatever `store_every` says: a
#: busy scenario (metro-1000: ~10,000 a slot) would otherwise hold every
#: record of `store_every` slots, and memory would grow with the load.
MAX_UNSENT_RECORDS = 10_000


class StoreWriter:
    """One run's queued writes and when they are sent; a no-op without a store."""

    def __init__(
        self,
        store: Store | None,
        run_id: str,
        telemetry: Callable[[], list[NodeTelemetry]] | None,
        store_every: int = 1,
        records: bool = True,
    ) -> None:
        """`telemetry` reads the nodes' telemetry once a slot (None: none is stored);
        `records`: store the slot's request records (False: they came from the store)."""
        self.store = store
        self.run_id = run_id
        self._store_records = records
        self._read_telemetry = telemetry
        self._store_every = max(1, store_every)
        self._unsent_records: list[RequestRecord] = []
        self._unsent_decisions: list[Decision[Any]] = []
        self._unsent_telemetry: list[NodeTelemetry] = []

    def record(
        self, slot: int, records: list[RequestRecord], decisions: list[Decision[Any]]
    ) -> None:
        """Queue the slot's writes; send them every `store_every` slots as a few batches."""
        if self.store is None:
            return
        if self._store_records:
            self._unsent_records.extend(records)
        self._unsent_decisions.extend(decisions)
        if self._read_telemetry is not None:
            self._unsent_telemetry.extend(
                t.model_copy(update={"run": self.run_id}) for t in self._read_telemetry()
            )
        if (slot + 1) % self._store_every == 0 or len(self._unsent_records) >= MAX_UNSENT_RECORDS:
            self.flush()

    def hold(self, decision: Decision[Any]) -> None:
        """Queue one decision made outside a slot (a plan that finished at close)."""
        if self.store is not None:
            self._unsent_decisions.append(decision)

    def flush(self) -> None:
        """Hand the queued writes to the store, each exactly once.

        The queues are emptied *before* the writes: the store keeps what the
        server has not taken (its buffer, then a spill file), so handing a
        document over again, say from `close()` after a failed slot, could only
        store it twice. A store write never stops the loop: anything it raises
        is logged with what was lost.
        """
        store = self.store
        if store is None:
            return
        records, telemetry, decisions = (
            self._unsent_records,
            self._unsent_telemetry,
            self._unsent_decisions,
        )
        self._unsent_records, self._unsent_decisions, self._unsent_telemetry = [], [], []
        writes: list[tuple[str, int, Callable[[], None]]] = [
            ("request records", len(records), lambda: store.record_requests(records)),
            ("telemetry snapshots", len(telemetry), lambda: store.record_telemetry(telemetry)),
            # One insert per decision collection.
            ("decisions", len(decisions), lambda: store.record_decisions(decisions)),
        ]
        for what, n, write in writes:
            if not n:
                continue
            try:
                write()
            except Exception:  # a store bug must not stop the cluster either
                log.exception(
                    "run %s: %d %s could not be handed to the store", self.run_id, n, what
                )
