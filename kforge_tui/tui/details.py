"""Node details (source, result, prompt, response) read from the run store on demand.

Events carry only what the tree needs; the heavy fields live in the store. Finished nodes never
change, so their rows are cached; in-flight ones are read again each time.
"""
from __future__ import annotations

from collections import OrderedDict


class NodeDetails:
    def __init__(self, run_dir: str | None = None, store=None, *, cache: int = 256) -> None:
        self.run_dir = run_dir
        self._store = store
        self._cache: OrderedDict[int, dict] = OrderedDict()
        self._size = cache
        self.error: str | None = None

    def _open(self):
        if self._store is None and self.run_dir:
            try:
                from kforge_tui.store import RunStore

                self._store = RunStore.open(self.run_dir, readonly=True)
            except Exception as e:  # a missing/young store is shown as a message, not a crash
                self.error = str(e).splitlines()[0] if str(e) else type(e).__name__
        return self._store

    def get(self, node_id: int | None) -> dict | None:
        if node_id is None:
            return None
        if node_id in self._cache:
            self._cache.move_to_end(node_id)
            return self._cache[node_id]
        store = self._open()
        if store is None:
            return None
        try:
            row = store.node(node_id)
        except Exception as e:
            self.error = str(e).splitlines()[0] if str(e) else type(e).__name__
            return None
        if row and row.get("status") not in (None, "pending"):
            self._cache[node_id] = row
            if len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return row

    def close(self) -> None:
        close = getattr(self._store, "close", None)
        if close:
            close()


class DictDetails(NodeDetails):
    """Details from a plain mapping: scripted demos, the latency bench and tests without a run."""

    def __init__(self, rows: dict[int, dict]) -> None:
        super().__init__()
        self.rows = rows

    def get(self, node_id: int | None) -> dict | None:
        return self.rows.get(node_id) if node_id is not None else None
