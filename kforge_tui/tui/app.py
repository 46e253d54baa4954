"""The kforge TUI: a pure consumer of the typed event stream that steers the search via EngineControl.

Two ways in, one class: live (the engine coroutine runs in a Textual worker on this loop and its
sink posts each event as a message) and follow (a `StoreFollower` polls another process's run
store). Events are only queued on arrival; a short timer folds each batch into `RunModel` and
touches only the widgets whose data changed, so the UI never waits on the LLM, the compiler or
the GPU, and a 2,000-node tree stays responsive.
"""
from __future__ import annotations

import gc
import time
from typing import Any, Awaitable, Callable

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Footer, Tree
from textual.worker import Worker, WorkerState

from kforge_tui import events as ev
from kforge_tui.control import EngineControl
from kforge_tui.events import EventCallback
from kforge_tui.tui import themes
from kforge_tui.tui.details import NodeDetails
from kforge_tui.tui.messages import EngineEvent
from kforge_tui.tui.model import Dirty, RunModel
from kforge_tui.tui.palette import KforgeCommands
from kforge_tui.tui.screens.dialogs import ConfirmScreen, PromptScreen
from kforge_tui.tui.screens.editor import EditorScreen
from kforge_tui.tui.screens.help import HelpScreen
from kforge_tui.tui.widgets.logs import LogTabs, result_of
from kforge_tui.tui.widgets.plot import ProgressPlot
from kforge_tui.tui.widgets.profile import ProfileTable
from kforge_tui.tui.widgets.source import SourceView
from kforge_tui.tui.widgets.status import StatusBar
from kforge_tui.tui.widgets.tree import SearchTree

FLUSH_S = 0.05  # batch window: events are folded and drawn at most 20 times a second
FOLLOW_S = 0.5  # store poll interval in follow mode
DEFAULT_BUDGET_STEP = 16


def freeze_gc() -> None:
    """Take what exists now (Textual, torch, the loaded model, the widgets) out of the GC's scans.

    These objects live as long as the app, yet every full collection walks them all: measured by
    bench/tui_latency.py, gen-2 pauses reached 122 ms in the UI loop, most of the 200 ms budget
    for a key press. `gc.freeze()` is the documented remedy (gc module docs); called at mount and
    once the tasks appear (after the engine's load/profile/capture), it costs one collection then.
    """
    gc.collect()
    gc.freeze()


def B(key: str, action: str, description: str, show: bool = True, **kw) -> Binding:
    return Binding(key, action, description, show=show, id=f"kforge.{action.split('(')[0]}", **kw)


class KforgeApp(App):
    TITLE = "kforge"
    CSS_PATH = str(themes.CSS_PATH)
    COMMANDS = App.COMMANDS | {KforgeCommands}
    ACTION_BINDINGS = [
        B("question_mark", "help", "Help", key_display="?"),
        B("1", "focus_pane('profile')", "Profile", show=False),
        B("2", "focus_pane('tree')", "Tree", show=False),
        B("3", "focus_pane('source')", "Source", show=False),
        B("4", "focus_pane('logs')", "Logs", show=False),
        B("right_square_bracket", "next_task(1)", "Next task", show=False, key_display="]"),
        B("left_square_bracket", "next_task(-1)", "Prev task", show=False, key_display="["),
        B("o", "open_node", "Open node", show=False),
        B("d", "toggle_diff", "Diff"),
        B("e", "edit", "Edit"),
        B("r", "repair", "Repair"),
        B("g", "jump_best", "Best"),
        B("f", "next_failure", "Next fail"),
        B("slash", "filter", "Filter", key_display="/"),
        B("c", "collapse", "Collapse", show=False),
        B("p", "pause_all", "Pause all"),
        B("P", "pause_task", "Pause task", show=False, key_display="P"),
        B("b", "add_budget", "Budget"),
        B("s", "stop_task", "Stop task", show=False),
        B("x", "export", "Export"),
        B("t", "next_theme", "Theme", show=False),
        B("q", "quit", "Quit"),
    ]
    BINDINGS = ACTION_BINDINGS
    THEME_NAMES = ("kforge-dark", "kforge-light", "kforge-ansi")

    def __init__(self, *, control: EngineControl | None, run_dir: str | None, theme: str | None = None,
                 engine_runner: Callable[[EventCallback], Awaitable[Any]] | None = None, follow: bool = False,
                 details: NodeDetails | None = None, clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        for t in themes.load_themes():
            self.register_theme(t)
        self.theme = themes.resolve(theme, self.available_themes)
        self.control = control
        self.run_dir = run_dir
        self.engine_runner = engine_runner
        self.follow = follow
        self.clock = clock
        self.details = details if details is not None else NodeDetails(run_dir)
        self.model = RunModel()
        self.task_id: str | None = None
        self.node_id: int | None = None
        self.diff = False
        self.paused_all = False
        self.flushes = 0  # batches drawn: lets tests and the bench wait for "screen updated"
        self._queue: list[ev.Event] = []
        self._open_pending = False
        self._follower = None

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")
        profile = ProfileTable(id="profile")
        profile.border_title = "operators [1]"
        yield profile
        with Horizontal(id="main"):
            tree = SearchTree(id="tree")
            tree.border_title = "search tree [2]"
            yield tree
            with Vertical(id="detail"):
                src = SourceView(id="source")
                src.border_title = "kernel [3]"
                yield src
                yield LogTabs(id="logs")
        yield ProgressPlot(id="plot")
        yield Footer()

    def on_mount(self) -> None:
        freeze_gc()
        self.set_interval(FLUSH_S, self.flush)
        self.set_interval(1.0, self._tick)
        self._w(StatusBar).show(self.model, self.clock())
        self._w(SearchTree).focus()
        if self.follow:
            self._start_follow()
        if self.engine_runner is not None:
            self._run_engine()

    def _w(self, selector):
        """Main-screen widget lookup that works while a modal screen is on top."""
        return self.screen_stack[0].query_one(selector)

    # ------------------------------------------------------------------ event intake
    def sink(self, event: ev.Event) -> None:
        """The EventCallback handed to the engine; safe from the loop or another thread."""
        self.post_message(EngineEvent(event))

    def on_engine_event(self, message: EngineEvent) -> None:
        self._queue.append(message.event)

    def feed(self, events: list[ev.Event]) -> None:
        """Queue events directly (follow mode, scripted streams)."""
        self._queue.extend(events)

    @work(exclusive=True, group="engine", exit_on_error=False)
    async def _run_engine(self) -> Any:
        return await self.engine_runner(self.sink)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.group == "engine" and event.state == WorkerState.ERROR:
            err = event.worker.error
            msg = str(err).splitlines()[0] if err and str(err) else type(err).__name__
            self.notify(f"engine stopped: {msg}", severity="error", timeout=10)
            # queued, so it lands after the events the engine sent before failing
            self._queue += [ev.LogLine(level="error", message=f"engine stopped: {msg}"),
                            ev.Phase(name="failed", detail=msg), ev.RunFinished(summary={"error": msg})]

    def _start_follow(self) -> None:
        from kforge_tui.follow import StoreControl, StoreFollower

        try:
            self._follower = StoreFollower(self.run_dir)
        except Exception as e:
            self.notify(str(e).splitlines()[0], severity="error", timeout=15)
            return
        if self.control is None:
            self.control = StoreControl(self._follower.store)
        if getattr(self.details, "_store", None) is None and type(self.details) is NodeDetails:
            self.details._store = self._follower.store
        self._poll()
        self.set_interval(FOLLOW_S, self._poll)

    def _poll(self) -> None:
        try:
            self.feed(self._follower.poll())
        except Exception as e:  # a store mid-write or vanished: say so, keep the screen
            self.notify(f"store read failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
                        severity="warning")

    # ------------------------------------------------------------------ drawing
    def flush(self) -> None:
        """Fold the queued events into the model and redraw only what they changed."""
        if (not self._queue and not self._open_pending) or not self._main_ready():
            return
        batch, self._queue = self._queue, []
        d = Dirty()
        for e in batch:
            self.model.apply(e, d)
            if isinstance(e, ev.RunStarted) and e.run_dir and self.details.run_dir is None:
                self.details.run_dir = e.run_dir
                self.run_dir = self.run_dir or e.run_dir
        self._draw(d)
        if d.new_tasks:
            freeze_gc()  # the engine has loaded torch and the model by now
        if self._open_pending:
            self._open_pending = False
            self._show_node()
        self.flushes += 1

    def _draw(self, d: Dirty) -> None:
        m = self.model
        table = self._w(ProfileTable)
        tree = self._w(SearchTree)
        for tid in m.tasks:  # profile order, not the order the batch touched them
            if tid in d.tasks:
                table.upsert(m.tasks[tid])
        if self.task_id is None and m.tasks:
            self.select_task(next(iter(m.tasks)))
        elif d.nodes:
            tree.apply(m, d.nodes)
        if d.header:
            self._w(StatusBar).show(m, self.clock())
        if self.task_id in d.tasks:
            t = m.tasks[self.task_id]
            self._w(ProgressPlot).show(t.history, t.best_speedup)
        if self.node_id in d.nodes:
            self._open_pending = True
        if d.logs:
            self._w(LogTabs).show_run_log(m.logs)

    def _tick(self) -> None:
        if self.model.running and self._main_ready():
            self._w(StatusBar).show(self.model, self.clock())

    def _main_ready(self) -> bool:
        """False while the app is tearing down (timers may still fire after widgets are gone)."""
        return bool(self.screen_stack) and bool(
            self.screen_stack[0].query(StatusBar))

    def select_task(self, task_id: str) -> None:
        if task_id not in self.model.tasks or not self._main_ready():
            return
        self.task_id = task_id
        t = self.model.tasks[task_id]
        tree = self._w(SearchTree)
        tree.show_task(self.model, task_id)
        tree.border_title = f"search tree [2] {t.op} {'x'.join(map(str, t.shape))}"
        self._w(ProgressPlot).show(t.history, t.best_speedup)
        table = self._w(ProfileTable)
        if table.task_at_cursor() != task_id and task_id in table.rows:
            table.move_cursor(row=table.get_row_index(task_id))

    def open_node(self, node_id: int | None) -> None:
        self.node_id = node_id
        self._show_node()

    def _show_node(self) -> None:
        n = self.model.nodes.get(self.node_id) if self.node_id is not None else None
        row = self.details.get(self.node_id)
        parent = self.details.get(n.parent_id) if n is not None and n.parent_id is not None else None
        err = result_of(row).get("error_line") if row else None
        self._w(SourceView).show(row, parent, diff=self.diff, backend=self.model.device or None,
                                        error_line=err, dark=self.current_theme.dark)
        logs = self._w(LogTabs)
        logs.show_node(row)
        if row and n is not None and n.failed:
            logs.active = "log-mismatch" if result_of(row).get("mismatch") else "log-compile"
        elif row and n is not None and n.status == "ok" and n.action != "root":
            logs.active = "log-timing"
        if row is None and self.node_id is not None and self.details.error:
            self._w(SourceView).border_subtitle = self.details.error[:60]

    # ------------------------------------------------------------------ widget messages
    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key is not None and event.row_key.value != self.task_id:
            self.select_task(event.row_key.value)

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted) -> None:
        if event.node.data is not None and event.node.data != self.node_id:
            self.node_id = event.node.data
            self._open_pending = True
            self.call_later(self._open_now)  # after queued keys: key repeat opens only the last node

    def _open_now(self) -> None:
        if self._open_pending and self._main_ready():
            self._open_pending = False
            self._show_node()

    def on_tree_node_selected(self, event: Tree.NodeSelected) -> None:
        if event.node.data is not None:
            self.open_node(event.node.data)

    # ------------------------------------------------------------------ actions
    def _need_task(self) -> str | None:
        if self.task_id is None:
            self.notify("No task selected yet.", severity="warning")
        return self.task_id

    def _need_control(self) -> EngineControl | None:
        if self.control is None:
            self.notify("No engine attached to this view (read-only).", severity="warning")
        return self.control

    def _call(self, what: str, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as e:
            self.notify(f"{what} failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
                        severity="error")
        else:
            self.notify(what)

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.ACTION_BINDINGS))

    def action_focus_pane(self, name: str) -> None:
        self._w(f"#{name}").focus()

    def action_next_task(self, step: int) -> None:
        ids = list(self.model.tasks)
        if not ids:
            return
        i = ids.index(self.task_id) if self.task_id in ids else -step
        self.select_task(ids[(i + step) % len(ids)])

    def action_open_node(self) -> None:
        nid = self._w(SearchTree).current_node_id
        if nid is not None:
            self.open_node(nid)
            self._w(SourceView).focus()

    def action_toggle_diff(self) -> None:
        self.diff = not self.diff
        self._show_node()

    def action_jump_best(self) -> None:
        t = self.model.tasks.get(self.task_id) if self.task_id else None
        if t is None or t.best_node is None:
            self.notify("No verified kernel yet for this task.")
            return
        tree = self._w(SearchTree)
        if not tree.select_node_id(t.best_node):
            self.notify(f"Best node #{t.best_node} is hidden by the filter.")
            return
        self.open_node(t.best_node)

    def action_next_failure(self) -> None:
        tree = self._w(SearchTree)
        nid = tree.next_failure(self.model)
        if nid is None:
            self.notify("No failed node in this tree.")
            return
        tree.select_node_id(nid)
        self.open_node(nid)

    def action_collapse(self) -> None:
        self._w(SearchTree).toggle_collapse()

    def action_filter(self) -> None:
        def done(value: str | None) -> None:
            if value is not None and self.task_id:
                self._w(SearchTree).show_task(self.model, self.task_id, filter=value.strip())
                self.notify(f"filter: {value.strip()}" if value.strip() else "filter cleared")

        tree = self._w(SearchTree)
        self.push_screen(PromptScreen("Show nodes matching (id, action, status, 'failed'; empty clears):",
                                      tree.filter), done)

    def action_edit(self) -> None:
        tid = self._need_task()
        if tid is None or self.node_id is None:
            if tid is not None:
                self.notify("Open a node first.", severity="warning")
            return
        row = self.details.get(self.node_id)
        if not row or not row.get("source"):
            self.notify("This node has no kernel source to edit (the root is the PyTorch reference).",
                        severity="warning")
            return
        parent = self.node_id

        def done(source: str | None) -> None:
            if source is not None and self._need_control():
                self._call(f"submitted hand-written child of #{parent}", self.control.submit_source,
                           tid, parent, source)

        self.push_screen(EditorScreen(row["source"], f"editing #{parent} — ctrl+s submits a hand-written child, f7 selects all, "
                                      "esc cancels", self.model.device or None), done)

    def action_repair(self) -> None:
        n = self.model.nodes.get(self.node_id) if self.node_id is not None else None
        if n is None or not n.failed:
            self.notify("Repair needs a failed node: open one (f jumps to the next failure).", severity="warning")
            return
        if self._need_control():
            self._call(f"repair of #{n.node_id} requested", self.control.repair, n.task_id, n.node_id)

    def action_pause_all(self) -> None:
        if not self._need_control():
            return
        if self.paused_all:
            self._call("search resumed", self.control.resume, None)
        else:
            self._call("search paused (in-flight evaluations finish)", self.control.pause, None)
        self.paused_all = not self.paused_all

    def action_pause_task(self) -> None:
        tid = self._need_task()
        if tid is None or not self._need_control():
            return
        if self.model.tasks[tid].status == "paused":
            self._call(f"{tid} resumed", self.control.resume, tid)
        else:
            self._call(f"{tid} paused", self.control.pause, tid)

    def action_add_budget(self) -> None:
        tid = self._need_task()
        if tid is None or not self._need_control():
            return

        def done(value: str | None) -> None:
            if value is None:
                return
            try:
                extra = int(value)
                if extra <= 0:
                    raise ValueError
            except ValueError:
                self.notify(f"budget must be a positive whole number, not {value!r}", severity="error")
                return
            self._call(f"{tid}: +{extra} candidates", self.control.add_budget, tid, extra)

        self.push_screen(PromptScreen(f"Extra candidates for {tid}:", str(DEFAULT_BUDGET_STEP)), done)

    def action_stop_task(self) -> None:
        tid = self._need_task()
        if tid is not None and self._need_control():
            self._call(f"{tid} stopping", self.control.stop_task, tid)

    def action_export(self) -> None:
        if not self.run_dir:
            self.notify("No run directory to export from.", severity="warning")
            return

        def done(value: str | None) -> None:
            if value and value.strip():
                self._export(value.strip())

        self.push_screen(PromptScreen("Export winners to directory:", f"{self.run_dir}/export"), done)

    @work(thread=True, exclusive=True, group="export", exit_on_error=False)
    def _export(self, out_dir: str) -> None:
        try:
            from kforge_tui.integrate.export import export_run

            export_run(self.run_dir, out_dir)
        except Exception as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            self.call_from_thread(self.notify, f"export failed: {msg}", severity="error", timeout=10)
        else:
            self.call_from_thread(self.notify, f"exported winners to {out_dir}")

    def action_next_theme(self) -> None:
        names = self.THEME_NAMES
        i = names.index(self.theme) if self.theme in names else -1
        self.theme = names[(i + 1) % len(names)]

    def watch_theme(self, _old: str, _new: str) -> None:
        if self.is_mounted and getattr(self, "node_id", None) is not None:
            self._open_pending = True  # re-render the source in the new theme's syntax colours

    async def action_quit(self) -> None:
        if not self.model.running:
            self.exit(0)
            return
        live = self.engine_runner is not None
        q = ("A search is running. Quit? Evaluated candidates are already in the store; "
             "`kforge resume` re-queues the ones in flight." if live else
             "The run keeps going in its own process; quit this view?")

        def done(yes: bool | None) -> None:
            if not yes:
                return
            if live and self.control is not None:
                try:
                    self.control.request_stop()
                except Exception:
                    pass
            self.exit(0)

        self.push_screen(ConfirmScreen(q), done)

    def on_unmount(self) -> None:
        if self._follower is not None:
            self._follower.close()
        self.details.close()


def run_follow(run_dir, *, theme: str | None = None) -> int:
    """`kforge tui RUN_DIR`: open a finished run, or follow one another process is writing."""
    from pathlib import Path

    from kforge_tui.errors import UsageError

    if not (Path(run_dir) / "run.db").is_file():
        raise UsageError(f"{run_dir} is not a kforge run directory (no run.db)")
    from kforge_tui.store import RunStore

    RunStore.open(run_dir, readonly=True).close()  # one-line UsageError on a corrupt store, before the screen
    app = KforgeApp(control=None, run_dir=str(run_dir), theme=theme, follow=True)
    rc = app.run()
    return int(rc or 0)


def live_app(settings, *, theme: str | None = None) -> KforgeApp:
    """The app `run_live` runs, with the engine attached; split out so tests drive the same path.

    The engine is told to keep serving after the budget is spent (`serve`): in the live TUI a
    person edits and submits kernels, or asks for repairs, after the search ended; quitting stops it.
    """
    from kforge_tui.engine import Engine

    settings.serve = True
    app: KforgeApp

    async def runner(sink):
        engine = Engine(settings, sink)
        app.control = engine
        return await engine.run()

    app = KforgeApp(control=None, run_dir=getattr(settings, "run_dir", None), theme=theme, engine_runner=runner)
    return app


def run_live(settings, *, theme: str | None = None, resume: bool = False) -> int:
    """`kforge optimize` / `kforge resume` without --headless: the engine runs on the app's loop.

    `resume` only confirms what `settings_for_resume` already set (the CLI passes it).
    """
    if resume:
        settings.resume = True
    rc = live_app(settings, theme=theme).run()
    return int(rc or 0)
