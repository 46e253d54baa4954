"""The run store: one SQLite file per run (RUN_DIR/run.db), the single source of truth.

Everything a run learns (settings, profile, tasks, every candidate with its prompt, response,
source and results, LLM usage, UI commands) is written here and committed at once, so a run
killed with `kill -9` loses only candidates still in flight (status "pending"), and another
process (`kforge tui RUN_DIR`, `kforge show`) can follow it by polling `max_seq()`.

Contract: docs/store_api.md. Additions beyond it (backward compatible): `root_node(task_id)`;
`add_task` creates the task's root node (action "root", status "ok", speedup 1.0, reward 0.0)
and `add_node(..., action="root")` returns that root instead of adding a second one;
`add_node(task_id, None, action=...)` for a non-root action attaches to the root; tasks()
rows also carry `failed`, `pending`, `floor_us`, the pooled references (`reference`, with
`baseline_us` and `compiled_us` their medians) and the winner by summary.TaskFigures' rule
(`best_node`, `speedup` = `baseline_us / best_us`; `leader_node` / `noisy_leader`), and
`control` (`set_control`: stops and pauses as stored state, so they survive kill and resume).
The owner writes a heartbeat (`beat`, meta key "owner") while it runs.

Why stdlib sqlite3 and not an ORM: the schema is small, and WAL + explicit transactions is all
the concurrency story needs. Opening is careful: a file is first opened read-only and its
`meta` table checked, so a corrupt or foreign file is reported (UsageError) and never touched.

Ownership: the process that runs the search holds an `flock` on RUN_DIR/owner.lock (`create`, or
`open(owner=True)` on resume) until it closes the store; the kernel drops it when the process
dies, `kill -9` included. `owner_pid()` is how a TUI tells a live run (steer it through the
`commands` table) from a finished or killed one (resume it and become the owner itself).

Privacy: a run holds the user's captured tensors, outputs and prompts, so the run directory and
its `captures/` and `cache/` are created 0700 and `run.db` (and SQLite's -wal/-shm, which take
its mode) 0600. Every created run is also recorded in the user data directory (`register_run`),
so `kforge runs` finds runs made with `--run-dir` anywhere.
"""
from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from kforge_tui.errors import UsageError

SCHEMA_NAME = "kforge-run"
SCHEMA_VERSION = 1
DB_NAME = "run.db"
OWNER_LOCK = "owner.lock"
REGISTRY = "runs.txt"  # in the user data directory: one absolute run directory per line

RUN_STATUSES = ("running", "finished", "stopped", "failed")
TASK_STATUSES = ("waiting", "searching", "paused", "done", "failed", "stopped")

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE run (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    model TEXT NOT NULL, settings TEXT NOT NULL, device TEXT NOT NULL, proposer TEXT NOT NULL,
    status TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL,
    end_to_end TEXT, profile TEXT, seq INTEGER NOT NULL DEFAULT 0);
CREATE TABLE tasks (
    task_id TEXT PRIMARY KEY, ord INTEGER NOT NULL, op TEXT NOT NULL, shape TEXT NOT NULL,
    dtype TEXT NOT NULL, task TEXT NOT NULL, budget INTEGER NOT NULL, status TEXT NOT NULL,
    baseline TEXT, seq INTEGER NOT NULL DEFAULT 0);
CREATE TABLE nodes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL REFERENCES tasks(task_id), parent_id INTEGER REFERENCES nodes(id),
    action TEXT NOT NULL, proposer TEXT NOT NULL, params TEXT NOT NULL DEFAULT '{}',
    source TEXT, prompt TEXT, response TEXT, hand_written INTEGER NOT NULL DEFAULT 0,
    status TEXT NOT NULL, message TEXT NOT NULL DEFAULT '', result TEXT, reward REAL,
    time_us REAL, speedup REAL, created REAL NOT NULL, finished REAL, seq INTEGER NOT NULL,
    worker TEXT);
CREATE INDEX nodes_task ON nodes(task_id, id);
CREATE INDEX nodes_seq ON nodes(seq);
CREATE TABLE llm_usage (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, model TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, cost_usd REAL NOT NULL,
    ok INTEGER NOT NULL, error TEXT);
CREATE TABLE commands (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, name TEXT NOT NULL,
    args TEXT NOT NULL, taken REAL);
CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, event TEXT NOT NULL);
"""

_NODE_JSON = ("params", "result")


def _dumps(x: Any) -> str | None:
    return None if x is None else json.dumps(x, default=str)


def _loads(s: str | None) -> Any:
    return None if s is None else json.loads(s)


def _check_file(path: Path) -> None:
    """Open read-only and check it is a kforge run store; UsageError (one line) otherwise.

    Runs before any read-write connection exists, so a foreign or corrupt file is never
    modified (not even by WAL recovery or journal creation).
    """
    if not path.is_file():
        raise UsageError(f"{path.parent}: no run store there ({DB_NAME} not found)")
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as e:
        raise UsageError(f"{path}: cannot read ({e.strerror})") from None
    if head != b"SQLite format 3\x00":
        raise UsageError(f"{path}: not a kforge run store (not an SQLite database)")
    # No -wal file means no connection has it open (our stores are always WAL): read it as
    # immutable so SQLite creates no -wal/-shm next to a file that may not be ours. With a
    # -wal present (a live or killed run) committed data may sit in the WAL: plain read-only.
    live = path.with_name(path.name + "-wal").exists()
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?{'mode=ro' if live else 'immutable=1'}",
                              uri=True)
    except sqlite3.Error as e:
        raise UsageError(f"{path}: cannot open ({e})") from None
    try:
        rows = dict(con.execute("SELECT key, value FROM meta").fetchall())
        con.execute("SELECT id FROM run").fetchall()
    except sqlite3.DatabaseError as e:
        if "no such table" in str(e):
            raise UsageError(f"{path}: not a kforge run store ({e})") from None
        raise UsageError(f"{path}: not a kforge run store or corrupt ({e})") from None
    finally:
        con.close()
    if rows.get("schema") != SCHEMA_NAME:
        raise UsageError(f"{path}: not a kforge run store (schema {rows.get('schema')!r})")
    try:
        version = int(rows.get("version", ""))
    except ValueError:
        raise UsageError(f"{path}: corrupt run store (bad schema version)") from None
    if version > SCHEMA_VERSION:
        raise UsageError(f"{path}: written by a newer kforge (store version {version}, "
                         f"this one reads {SCHEMA_VERSION})")


class RunStore:
    """One run's SQLite store. Thread-safe (one connection behind a lock)."""

    def __init__(self, run_dir: Path, con: sqlite3.Connection, readonly: bool):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / DB_NAME
        self.readonly = readonly
        self._con = con
        self._lock = threading.RLock()
        self._owner_fd: int | None = None

    # ------------------------------------------------------------------- open/create

    @classmethod
    def create(cls, run_dir, *, model: str, settings: dict, device: dict,
               proposer: str) -> "RunStore":
        run_dir = Path(run_dir)
        path = run_dir / DB_NAME
        if path.exists():
            raise UsageError(f"{run_dir} already holds a run (use `kforge resume {run_dir}`)")
        from kforge_tui.config import private_dir

        try:
            for d in (run_dir, run_dir / "captures", run_dir / "cache"):
                private_dir(d)
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))  # SQLite gives -wal/-shm this mode
        except OSError as e:  # read-only, under a file, /proc: the user's input, in one line
            raise UsageError(f"cannot create the run directory {run_dir}: "
                             f"{e.strerror or e}{f' ({e.filename})' if e.filename else ''}") from None
        con = cls._connect(path)
        con.execute("PRAGMA journal_mode=WAL")
        store = cls(run_dir, con, readonly=False)
        store.claim_owner()
        now = time.time()
        with store._tx() as c:
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    c.execute(stmt)
            c.executemany("INSERT INTO meta VALUES (?, ?)",
                          [("schema", SCHEMA_NAME), ("version", str(SCHEMA_VERSION)),
                           ("seq", "0")])
            c.execute("INSERT INTO run (id, model, settings, device, proposer, status, created, "
                      "updated) VALUES (1, ?, ?, ?, ?, 'running', ?, ?)",
                      (model, _dumps(settings), _dumps(device), proposer, now, now))
        return store

    @classmethod
    def open(cls, run_dir, *, readonly: bool = False, owner: bool = False) -> "RunStore":
        """`owner=True`: this process will run the search (resume); UsageError if another does."""
        run_dir = Path(run_dir)
        if run_dir.name == DB_NAME and run_dir.is_file():
            run_dir = run_dir.parent
        path = run_dir / DB_NAME
        _check_file(path)
        try:
            if readonly:
                con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True,
                                      check_same_thread=False, isolation_level=None, timeout=10)
            else:
                con = cls._connect(path)
                con.execute("PRAGMA journal_mode=WAL")
        except sqlite3.Error as e:
            raise UsageError(f"{path}: cannot open ({e})") from None
        store = cls(run_dir, con, readonly)
        if not readonly:
            store._migrate()
        if owner:
            try:
                store.claim_owner()
            except BaseException:
                store.close()
                raise
        return store

    def _migrate(self) -> None:
        """Bring a store made by an older kforge up to this schema (additive: columns only, so
        an older kforge still reads it)."""
        cols = {r["name"] for r in self._q("PRAGMA table_info(nodes)")}
        if "worker" not in cols:  # which worker and node evaluated a candidate (issue 23)
            with self._tx() as c:
                c.execute("ALTER TABLE nodes ADD COLUMN worker TEXT")

    @staticmethod
    def _connect(path: Path) -> sqlite3.Connection:
        con = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=10)
        con.execute("PRAGMA synchronous=NORMAL")
        con.execute("PRAGMA foreign_keys=ON")
        return con

    def close(self) -> None:
        with self._lock:
            self._con.close()
            if self._owner_fd is not None:
                os.close(self._owner_fd)  # drops the flock: the run has no owner any more
                self._owner_fd = None

    def claim_owner(self) -> None:
        """Hold RUN_DIR/owner.lock for as long as this store is open (see the module docstring)."""
        fd = os.open(self.run_dir / OWNER_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise UsageError(f"{self.run_dir} is being run by another kforge process (pid {pid}); "
                             f"watch and steer it with `kforge tui {self.run_dir}`") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._owner_fd = fd

    def __enter__(self) -> "RunStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One committed write transaction (BEGIN IMMEDIATE: writers never deadlock)."""
        if self.readonly:
            raise UsageError(f"{self.path}: opened read-only")
        with self._lock:
            self._con.execute("BEGIN IMMEDIATE")
            try:
                yield self._con
            except BaseException:
                self._con.execute("ROLLBACK")
                raise
            self._con.execute("COMMIT")

    def _bump(self, c: sqlite3.Connection) -> int:
        c.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'seq'")
        return int(c.execute("SELECT value FROM meta WHERE key = 'seq'").fetchone()[0])

    def _q(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        with self._lock:
            cur = self._con.execute(sql, args)
            cols = [d[0] for d in cur.description]
            return [dict(zip(cols, r)) for r in cur.fetchall()]

    # ------------------------------------------------------------------------- run

    def run_info(self) -> dict:
        r = self._q("SELECT * FROM run WHERE id = 1")[0]
        return {"model": r["model"], "settings": _loads(r["settings"]),
                "device": _loads(r["device"]), "proposer": r["proposer"], "status": r["status"],
                "created": r["created"], "updated": r["updated"],
                "end_to_end": _loads(r["end_to_end"]), "run_dir": str(self.run_dir)}

    def _set_run(self, col: str, value: Any) -> None:
        with self._tx() as c:
            seq = self._bump(c)
            c.execute(f"UPDATE run SET {col} = ?, updated = ?, seq = ? WHERE id = 1",
                      (value, time.time(), seq))

    def set_run_status(self, status: str) -> None:
        if status not in RUN_STATUSES:
            raise ValueError(f"run status must be one of {RUN_STATUSES}, not {status!r}")
        self._set_run("status", status)

    def set_end_to_end(self, report: dict) -> None:
        self._set_run("end_to_end", _dumps(report))

    def save_profile(self, rows: list[dict]) -> None:
        self._set_run("profile", _dumps(rows))

    def profile(self) -> list[dict]:
        return _loads(self._q("SELECT profile FROM run WHERE id = 1")[0]["profile"]) or []

    # ----------------------------------------------------------------------- tasks

    def add_task(self, task, budget: int) -> None:
        """Idempotent on task_id (resume); also creates the task's root node."""
        tj = task.to_json() if hasattr(task, "to_json") else dict(task)
        tid = tj["task_id"]
        first = (tj.get("inputs") or [{}])[0]  # plain-JSON tasks: the first input describes the row
        shape = list(getattr(task, "shape", None) or tj.get("shape") or first.get("shape") or [])
        dtype = getattr(task, "dtype", None) or tj.get("dtype") or first.get("dtype") or ""
        with self._tx() as c:
            if c.execute("SELECT 1 FROM tasks WHERE task_id = ?", (tid,)).fetchone():
                return
            seq = self._bump(c)
            ord_ = c.execute("SELECT COUNT(*) FROM tasks").fetchone()[0]
            c.execute("INSERT INTO tasks (task_id, ord, op, shape, dtype, task, budget, status, seq)"
                      " VALUES (?, ?, ?, ?, ?, ?, ?, 'waiting', ?)",
                      (tid, ord_, tj["op"], _dumps(shape), dtype, _dumps(tj), int(budget),
                       seq))
            now = time.time()
            c.execute("INSERT INTO nodes (task_id, parent_id, action, proposer, status, message, "
                      "reward, speedup, created, finished, seq) VALUES "
                      "(?, NULL, 'root', 'reference', 'ok', 'PyTorch reference', 0.0, 1.0, ?, ?, ?)",
                      (tid, now, now, seq))

    def _set_task(self, task_id: str, col: str, value: Any) -> None:
        with self._tx() as c:
            seq = self._bump(c)
            cur = c.execute(f"UPDATE tasks SET {col} = ?, seq = ? WHERE task_id = ?",
                            (value, seq, task_id))
            if cur.rowcount == 0:
                raise KeyError(f"no task {task_id!r} in {self.path}")

    def set_baseline(self, task_id: str, baseline: dict) -> None:
        if hasattr(baseline, "__dataclass_fields__"):
            from dataclasses import asdict

            baseline = asdict(baseline)
        self._set_task(task_id, "baseline", _dumps(baseline))

    def set_task_status(self, task_id: str, status: str) -> None:
        if status not in TASK_STATUSES:
            raise ValueError(f"task status must be one of {TASK_STATUSES}, not {status!r}")
        self._set_task(task_id, "status", status)

    def set_budget(self, task_id: str, budget: int) -> None:
        self._set_task(task_id, "budget", int(budget))

    # ------------------------------------------------------------ stored control state

    def set_control(self, task_id: str | None, **flags) -> None:
        """What the user asked of an op (`task_id`) or of the whole search (None): `stopped`,
        `paused`. Kept in the store so a stop or a pause survives a kill and `kforge resume`,
        and every attached view shows it at once (a stop reads `stopping` until it lands)."""
        key = task_id or "*"
        with self._tx() as c:
            row = c.execute("SELECT value FROM meta WHERE key = 'control'").fetchone()
            state = _loads(row[0]) if row else {}
            if key == "*" and flags.get("paused") is False:  # resume all: every op's pause too
                for e in state.values():
                    e.pop("paused", None)
            state[key] = {**state.get(key, {}), **flags, "ts": time.time()}
            self._bump(c)
            c.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('control', ?)", (_dumps(state),))

    def control(self) -> dict:
        """{task_id or "*": {"stopped"?: bool, "paused"?: bool, "ts": float}}."""
        rows = self._q("SELECT value FROM meta WHERE key = 'control'")
        return (_loads(rows[0]["value"]) or {}) if rows else {}

    def beat(self, started: float) -> None:
        """The owner's heartbeat (pid, host, start, now); not a change a follower must re-read,
        so no seq bump. With the owner lock it tells a live owner from a dead or hung one."""
        import socket

        rec = {"pid": os.getpid(), "host": socket.gethostname(), "started": started, "beat": time.time()}
        with self._tx() as c:
            c.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('owner', ?)", (_dumps(rec),))

    def heartbeat(self) -> dict | None:
        rows = self._q("SELECT value FROM meta WHERE key = 'owner'")
        return _loads(rows[0]["value"]) if rows else None

    _TASKS_SQL = """
        SELECT t.*,
          (SELECT COUNT(*) FROM nodes n WHERE n.task_id = t.task_id AND n.parent_id IS NOT NULL
             AND n.status NOT IN ('pending', 'lost') AND n.action NOT LIKE 'confirm:%') AS evaluated,
          (SELECT COUNT(*) FROM nodes n WHERE n.task_id = t.task_id AND n.parent_id IS NOT NULL
             AND n.status NOT IN ('pending', 'ok', 'lost') AND n.action NOT LIKE 'confirm:%') AS failed,
          (SELECT COUNT(*) FROM nodes n WHERE n.task_id = t.task_id
             AND n.status = 'pending') AS pending
        FROM tasks t"""
    # Re-timings are not search candidates: they count neither as evaluated nor as failed.
    # The reference times and the winner are summary.TaskFigures' (the TUI's live model applies
    # the same class), from these light columns of every finished node.
    # (only verified nodes' results are parsed: a failed one's is mostly its compiler log)
    _FIGURES_SQL = """
        SELECT id, task_id, parent_id, action, status, time_us,
          CASE WHEN status = 'ok' THEN json_extract(result, '$.timing.median_us') END AS t_med,
          CASE WHEN status = 'ok' THEN json_extract(result, '$.timing.p10_us') END AS t_p10,
          CASE WHEN status = 'ok' THEN json_extract(result, '$.timing.p90_us') END AS t_p90,
          CASE WHEN status = 'ok' THEN json_extract(result, '$.baseline.median_us') END AS eager_us,
          CASE WHEN status = 'ok' THEN json_extract(result, '$.compiled.median_us') END AS compiled_us,
          CASE WHEN status = 'ok' THEN json_extract(result, '$.baseline.clock') END AS eager_clock,
          CASE WHEN status = 'ok' THEN json_extract(result, '$.compiled.clock') END AS compiled_clock
        FROM nodes WHERE parent_id IS NOT NULL AND status NOT IN ('pending', 'lost')"""

    def _figures(self, task_id: str | None = None) -> dict[str, list]:
        from kforge_tui.figures import NodeFigure, spread_of

        sql, args = (self._FIGURES_SQL + " AND task_id = ?", (task_id,)) if task_id else (self._FIGURES_SQL, ())
        out: dict[str, list] = {}
        for r in self._q(sql + " ORDER BY id", args):
            t = {"median_us": r["t_med"], "p10_us": r["t_p10"], "p90_us": r["t_p90"]}
            out.setdefault(r["task_id"], []).append(NodeFigure(
                r["id"], r["parent_id"], r["action"] or "", r["status"], r["time_us"], spread_of(t),
                r["eager_us"], r["compiled_us"], r["eager_clock"] or "", r["compiled_clock"] or ""))
        return out

    def _lang_of(self, node_id: int, task) -> str | None:
        """The kernel language of a node's source (search/languages.py)."""
        from kforge_tui.search.languages import language_of

        rows = self._q("SELECT source FROM nodes WHERE id = ?", (node_id,))
        src = rows[0]["source"] if rows else None
        backend = task.get("backend") if isinstance(task, dict) else None
        return language_of(src, backend or "cuda") if src else None

    def _task_row(self, r: dict, figures: list, control: dict) -> dict:
        from kforge_tui.figures import TaskFigures

        base, task = _loads(r["baseline"]), _loads(r["task"])
        f = TaskFigures(base if isinstance(base, dict) else None)
        for fig in figures:
            f.update(fig)
        best, leader = f.best(), f.leader()
        ref, comp = f.reference("eager"), f.reference("compiled")
        # node zero (Inductor's own kernel, search/node_zero.py): the search's start, on the clock
        # of every other candidate
        from kforge_tui.search.node_zero import ACTION as SEED_ACTION

        seed = next((g for g in figures if g.action == SEED_ACTION and g.status == "ok"), None)
        ref_json = lambda x: {"median_us": x.median_us, "spread": x.spread, "n": x.n, "clock": x.clock}  # noqa: E731
        return {"task_id": r["task_id"], "op": r["op"], "shape": _loads(r["shape"]),
                "dtype": r["dtype"], "task": task, "budget": r["budget"],
                "status": r["status"], "baseline": base, "evaluated": r["evaluated"],
                "failed": r["failed"], "pending": r["pending"],
                "best_node": best.node_id if best else None,
                "best_us": best.time_us if best else None, "best_spread": best.spread if best else None,
                "speedup": ref.over(best.time_us) if best else None,
                "speedup_vs_compile": comp.over(best.time_us) if best else None,
                "leader_node": leader.node_id if leader else None,
                "noisy_leader": leader.node_id if leader is not None and leader is not best else None,
                "verified": any(g.is_candidate and g.status == "ok" for g in figures),
                "baseline_us": ref.median_us, "compiled_us": comp.median_us,
                "reference": {"eager": ref_json(ref), "compiled": ref_json(comp)},
                "floor_us": base.get("floor_us") if isinstance(base, dict) else None,
                "control": control.get(r["task_id"], {}), "seq": r["seq"],
                "best_lang": self._lang_of(best.node_id, task) if best else None,  # the winner's language
                "seed_node": seed.node_id if seed else None, "seed_us": seed.time_us if seed else None,
                # what the figures measure: "device" (cuda event time, host kept ahead) or "wall"
                "clock": ((base.get("compiled") or base.get("eager") or {}).get("clock") or None)
                if isinstance(base, dict) else None}

    def failures(self, task_id: str) -> list[dict]:
        """Why a task's candidates failed, most frequent status first: [{"status", "n",
        "message"}], the message the newest failure of that status gave. A task with nothing
        verified is otherwise a bare "0 verified" in `show`; its user needs the reason without
        opening the TUI (a headless run on a GPU server)."""
        rows = self._q("SELECT status, COUNT(*) AS n, MAX(id) AS last FROM nodes WHERE task_id = ? "
                       "AND parent_id IS NOT NULL AND status NOT IN ('ok', 'pending', 'lost') "
                       "AND action NOT LIKE 'confirm:%' GROUP BY status ORDER BY n DESC, last DESC", (task_id,))
        out = []
        for r in rows:
            msg = self._q("SELECT message FROM nodes WHERE id = ?", (r["last"],))
            out.append({"status": r["status"], "n": r["n"], "message": msg[0]["message"] if msg else ""})
        return out

    def best_in_language(self, task_id: str, lang: str) -> tuple[int, float] | None:
        """(node id, time) of the task's winner among the candidates whose source is in `lang`,
        ranked as the task's own winner is (figures.TaskFigures: quiet figures, re-timings):
        integration builds one language per task, and an `auto` run's best may be in another
        (a Triton seed variant on a cuda task)."""
        from kforge_tui.figures import TaskFigures
        from kforge_tui.search.languages import language_of

        row = self.task(task_id)
        backend = (row.get("task") or {}).get("backend") or "cuda"
        keep = {r["id"] for r in self._q("SELECT id, source FROM nodes WHERE task_id = ?", (task_id,))
                if r["source"] and language_of(r["source"], backend) == lang}
        f = TaskFigures(row["baseline"] if isinstance(row.get("baseline"), dict) else None)
        for fig in self._figures(task_id).get(task_id, []):
            if fig.node_id in keep or (fig.is_retiming and fig.parent_id in keep):
                f.update(fig)
        best = f.best()
        return (best.node_id, best.time_us) if best else None

    def tasks(self) -> list[dict]:
        figures, control = self._figures(), self.control()
        return [self._task_row(r, figures.get(r["task_id"], []), control)
                for r in self._q(self._TASKS_SQL + " ORDER BY t.ord")]

    def task(self, task_id: str) -> dict:
        rows = self._q(self._TASKS_SQL + " WHERE t.task_id = ?", (task_id,))
        if not rows:
            raise KeyError(f"no task {task_id!r} in {self.path}")
        return self._task_row(rows[0], self._figures(task_id).get(task_id, []), self.control())

    def root_node(self, task_id: str) -> int:
        rows = self._q("SELECT id FROM nodes WHERE task_id = ? AND parent_id IS NULL "
                       "ORDER BY id LIMIT 1", (task_id,))
        if not rows:
            raise KeyError(f"no task {task_id!r} in {self.path}")
        return rows[0]["id"]

    # ----------------------------------------------------------------------- nodes

    def add_node(self, task_id: str, parent_id: int | None, *, action: str, proposer: str,
                 source: str | None = None, params: dict | None = None,
                 prompt: str | None = None, response: str | None = None,
                 hand_written: bool = False, status: str = "pending") -> int:
        if action == "root":
            return self.root_node(task_id)
        if parent_id is None:
            parent_id = self.root_node(task_id)
        with self._tx() as c:
            prow = c.execute("SELECT task_id FROM nodes WHERE id = ?", (parent_id,)).fetchone()
            if prow is None or prow[0] != task_id:
                raise KeyError(f"node {parent_id} is not a node of task {task_id!r}")
            seq = self._bump(c)
            cur = c.execute(
                "INSERT INTO nodes (task_id, parent_id, action, proposer, params, source, prompt, "
                "response, hand_written, status, created, seq) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (task_id, parent_id, action, proposer, _dumps(params or {}), source, prompt,
                 response, int(bool(hand_written)), status, time.time(), seq))
            return int(cur.lastrowid)

    def finish_node(self, node_id: int, *, status: str, message: str, result: dict | None,
                    reward: float, time_us: float | None = None,
                    speedup: float | None = None, worker: str | None = None) -> None:
        """`worker`: who evaluated it ("<node>/<worker>", EvalResult.worker); None: nobody did."""
        if hasattr(result, "to_json"):
            result = result.to_json()
        with self._tx() as c:
            seq = self._bump(c)
            cur = c.execute("UPDATE nodes SET status=?, message=?, result=?, reward=?, time_us=?, "
                            "speedup=?, finished=?, seq=?, worker=? WHERE id = ?",
                            (status, message, _dumps(result), reward, time_us, speedup,
                             time.time(), seq, worker or None, node_id))
            if cur.rowcount == 0:
                raise KeyError(f"no node {node_id} in {self.path}")

    def set_node_fields(self, node_id: int, **fields) -> None:
        """Fill prompt/response/source/params of a pending node after the proposal arrives."""
        allowed = {"source", "prompt", "response", "params", "action", "proposer"}
        bad = set(fields) - allowed
        if bad:
            raise ValueError(f"cannot set {sorted(bad)}")
        if not fields:
            return
        cols = ", ".join(f"{k} = ?" for k in fields)
        vals = [(_dumps(v) if k == "params" else v) for k, v in fields.items()]
        with self._tx() as c:
            seq = self._bump(c)
            c.execute(f"UPDATE nodes SET {cols}, seq = ? WHERE id = ?", (*vals, seq, node_id))

    @staticmethod
    def _node_row(r: dict, backend: str | None = None) -> dict:
        """A node as a dict; `lang` is the language of its source (search/languages.py:
        "triton", "cuda" or "cpu"; "pytorch" for the root, None before a proposal arrives),
        read off the source against its task's backend."""
        from kforge_tui.search.languages import language_of

        for k in _NODE_JSON:
            r[k] = _loads(r[k])
        if r["params"] is None:
            r["params"] = {}
        r["hand_written"] = bool(r["hand_written"])
        r.setdefault("worker", None)  # a store from before the column, opened read-only
        r.pop("task_backend", None)
        r["lang"] = "pytorch" if r["parent_id"] is None else (
            language_of(r["source"], backend or "cuda") if r.get("source") else None)
        return r

    _NODES_SQL = ("SELECT n.*, json_extract(t.task, '$.backend') AS task_backend FROM nodes n "
                  "JOIN tasks t ON t.task_id = n.task_id")

    def nodes(self, task_id: str | None = None, *, since_seq: int = 0) -> list[dict]:
        if task_id is None:
            rows = self._q(self._NODES_SQL + " WHERE n.seq > ? ORDER BY n.id", (since_seq,))
        else:
            rows = self._q(self._NODES_SQL + " WHERE n.task_id = ? AND n.seq > ? ORDER BY n.id",
                           (task_id, since_seq))
        return [self._node_row(r, r.get("task_backend")) for r in rows]

    def node(self, node_id: int) -> dict:
        rows = self._q(self._NODES_SQL + " WHERE n.id = ?", (node_id,))
        if not rows:
            raise KeyError(f"no node {node_id} in {self.path}")
        return self._node_row(rows[0], rows[0].get("task_backend"))

    def max_seq(self) -> int:
        return int(self._q("SELECT value FROM meta WHERE key = 'seq'")[0]["value"])

    def pending_nodes(self) -> list[dict]:
        return [self._node_row(r, r.get("task_backend"))
                for r in self._q(self._NODES_SQL + " WHERE n.status = 'pending' ORDER BY n.id")]

    # ------------------------------------------------------------------ llm usage

    def add_llm_usage(self, *, model: str, prompt_tokens: int, completion_tokens: int,
                      cost_usd: float, ok: bool, error: str | None = None) -> None:
        with self._tx() as c:
            self._bump(c)
            c.execute("INSERT INTO llm_usage (ts, model, prompt_tokens, completion_tokens, "
                      "cost_usd, ok, error) VALUES (?,?,?,?,?,?,?)",
                      (time.time(), model, int(prompt_tokens or 0), int(completion_tokens or 0),
                       float(cost_usd or 0.0), int(bool(ok)), error))

    def llm_totals(self) -> dict:
        """{calls, failures, prompt_tokens, completion_tokens, cost_usd, last_error}: running totals."""
        r = self._q("SELECT COUNT(*) AS calls, COALESCE(SUM(1 - ok), 0) AS failures, "
                    "COALESCE(SUM(prompt_tokens), 0) AS prompt_tokens, "
                    "COALESCE(SUM(completion_tokens), 0) AS completion_tokens, "
                    "COALESCE(SUM(cost_usd), 0.0) AS cost_usd FROM llm_usage")[0]
        r["cost_usd"] = float(r["cost_usd"])
        last = self._q("SELECT error FROM llm_usage WHERE ok = 0 ORDER BY id DESC LIMIT 1")
        r["last_error"] = (last[0]["error"] or "") if last else ""
        return r

    # ------------------------------------------------------------------- commands

    def post_command(self, name: str, args: dict) -> int:
        with self._tx() as c:
            self._bump(c)
            cur = c.execute("INSERT INTO commands (ts, name, args) VALUES (?, ?, ?)",
                            (time.time(), name, _dumps(args or {})))
            return int(cur.lastrowid)

    def untaken_commands(self) -> list[dict]:
        """Commands no owner has taken yet (read-only: a viewer checks what still waits)."""
        rows = self._q("SELECT id, ts, name, args FROM commands WHERE taken IS NULL ORDER BY id")
        return [{"id": r["id"], "ts": r["ts"], "name": r["name"], "args": _loads(r["args"])} for r in rows]

    def take_commands(self) -> list[dict]:
        with self._tx() as c:
            rows = c.execute("SELECT id, ts, name, args FROM commands WHERE taken IS NULL "
                             "ORDER BY id").fetchall()
            if rows:
                c.execute("UPDATE commands SET taken = ? WHERE taken IS NULL AND id <= ?",
                          (time.time(), rows[-1][0]))
        return [{"id": i, "ts": ts, "name": n, "args": _loads(a)} for i, ts, n, a in rows]

    # --------------------------------------------------------------------- events

    def append_event(self, event: dict) -> None:
        if hasattr(event, "to_json"):
            event = event.to_json()
        with self._tx() as c:
            self._bump(c)
            c.execute("INSERT INTO events (ts, event) VALUES (?, ?)",
                      (float(event.get("ts", time.time())), _dumps(event)))

    def events(self, since_id: int = 0) -> list[dict]:
        rows = self._q("SELECT id, event FROM events WHERE id > ? ORDER BY id", (since_id,))
        out = []
        for r in rows:
            e = _loads(r["event"])
            e["id"] = r["id"]
            out.append(e)
        return out


def owner_pid(run_dir) -> int | None:
    """The pid of the process running this run's search, or None when none is (finished, killed).

    A shared lock succeeds only when no owner holds the exclusive one; it is dropped at once.
    """
    path = Path(run_dir) / OWNER_LOCK
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None  # never owned (a store from before owner locks), or not readable
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.read(fd, 32).decode(errors="replace").strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _registry() -> Path:
    from kforge_tui.config import data_dir

    return data_dir() / REGISTRY


def register_run(run_dir) -> None:
    """Remember a run directory for `kforge runs` (one appended line: safe with concurrent runs)."""
    from kforge_tui.config import private_dir

    path = _registry()
    private_dir(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, (str(Path(run_dir).resolve()) + "\n").encode())
    finally:
        os.close(fd)


def registered_runs() -> list[Path]:
    """Run directories recorded by `register_run` that still hold a run store."""
    try:
        lines = _registry().read_text().splitlines()
    except OSError:
        return []
    return [Path(p) for p in dict.fromkeys(ln.strip() for ln in lines if ln.strip())
            if (Path(p) / DB_NAME).is_file()]


def run_summary(run_dir) -> dict | None:
    """run_info() plus run_dir, tasks, evaluated, verified; None for a foreign or corrupt store."""
    try:
        with RunStore.open(run_dir, readonly=True) as s:
            info = s.run_info()
            tasks = s.tasks()
    except (UsageError, sqlite3.Error):
        return None
    info["run_dir"] = str(run_dir)
    info["tasks"] = len(tasks)
    info["evaluated"] = sum(t["evaluated"] for t in tasks)
    info["verified"] = sum(1 for t in tasks if t["verified"])
    return info


def list_runs(root) -> list[dict]:
    """Every run store under `root` (RUN_DIR/run.db, any depth), newest first.

    Each: run_info() plus run_dir, tasks, evaluated. Foreign or corrupt run.db files are skipped
    (and left untouched).
    """
    root = Path(root)
    if not root.is_dir():
        return []
    out = [info for db in root.rglob(DB_NAME) if (info := run_summary(db.parent)) is not None]
    out.sort(key=lambda r: r["created"], reverse=True)
    return out
