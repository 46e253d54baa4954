"""The kforge TUI: a pure consumer of the typed event stream that steers the search via EngineControl.

Two ways in, one class. Live: the engine runs on its own thread and event loop (control.EngineThread,
inside a Textual thread worker), so its SQLite writes, compiles and worker I/O never stall a key
press; its events arrive as messages. Follow (`kforge tui RUN_DIR`): a thread worker polls another
process's run store (follow.StoreFollower) and posts the same events. Events are only queued on
arrival; a short timer folds each batch into `RunModel` and touches only the widgets whose data
changed, so a 2,000-node tree stays responsive.

Steering goes to whoever owns the run: our own engine thread, or the owning process through the
store's command table; on a run nobody owns any more (finished, killed) the TUI resumes it and
becomes the owner, so an edit or more budget is never refused. Commands are sent from one helper
thread, in order, and their outcome comes back as a `SteerResult` message.
"""
from __future__ import annotations

import gc
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Footer, Tree
from textual.worker import Worker, WorkerState, get_current_worker

from kforge_tui import events as ev
from kforge_tui.control import EngineControl, EngineThread
from kforge_tui.errors import UsageError
from kforge_tui.figures import retimed_node
from kforge_tui.summary import fmt_us
from kforge_tui.tui import themes
from kforge_tui.tui.details import NodeDetails
from kforge_tui.tui.highlight import lexer_for
from kforge_tui.tui.messages import EngineBatch, EngineEvent, SteerResult
from kforge_tui.tui.model import Dirty, RunModel
from kforge_tui.tui.palette import KforgeCommands
from kforge_tui.tui.screens.dialogs import ChoiceScreen, ConfirmScreen, PromptScreen
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
PANES = ("profile", "tree", "source", "logs")
EXTENSIONS = {"cuda": "cu", "cpp": "cpp"}
WORK_COMMANDS = ("submit_source", "repair", "add_budget")  # a finished run is resumed for these
STORED_COMMANDS = ("stop_task", "pause", "resume")  # kept in the store even when nobody runs the run


def freeze_gc() -> None:
    """Take what exists now (Textual, torch, the loaded model, the widgets) out of the GC's scans.

    These objects live as long as the app, yet every full collection walks them all: measured by
    bench/tui_latency.py, gen-2 pauses reached 122 ms in the UI loop, most of the 200 ms budget
    for a key press. `gc.freeze()` is the documented remedy (gc module docs); called at mount and
    once the tasks appear (after the engine's load/profile/capture), it costs one collection then.
    """
    gc.collect()
    gc.freeze()


def B(key: str, action: str, description: str, binding_id: str, show: bool = True, **kw) -> Binding:
    """A main-screen binding; its id is what the config file's [keymap] table rebinds."""
    return Binding(key, action, description, show=show, id=binding_id, **kw)


def tree_title(t, width: int) -> str:
    """`search tree [2] <op> <shape>` in the pane's width: the shape is what tells same-named ops
    apart, so the op name (then the words) give way first, never the shape."""
    shape = "x".join(map(str, t.shape))
    room = max(width - 4, 0)  # the border's corners and a space each side
    for head, least in (("search tree [2] ", 8), ("tree [2] ", 4), ("[2] ", 1)):
        op_room = room - len(head) - 1 - len(shape)
        if op_room >= min(least, len(t.op)):
            op = t.op if len(t.op) <= op_room else t.op[:max(op_room - 1, 1)] + "…"
            return f"{head}{op} {shape}"
    return f"[2] {shape}"


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


class KforgeApp(App):
    TITLE = "kforge"
    CSS_PATH = str(themes.CSS_PATH)
    COMMANDS = {KforgeCommands}  # kforge's commands only (not Textual's Quit, Maximize, Theme)
    # The footer shows what fits in 100 columns; `?` and the palette list every binding
    ACTION_BINDINGS = [
        B("question_mark", "help", "Help", "help", key_display="?"),
        B("z", "zoom", "Zoom", "zoom", show=False),
        B("1", "focus_pane('profile')", "Focus profile", "focus-profile", show=False),
        B("2", "focus_pane('tree')", "Focus tree", "focus-tree", show=False),
        B("3", "focus_pane('source')", "Focus source", "focus-source", show=False),
        B("4", "focus_pane('logs')", "Focus logs", "focus-logs", show=False),
        B("l", "next_log(1)", "Next log tab", "next-log", show=False),
        B("L", "next_log(-1)", "Previous log tab", "prev-log", show=False, key_display="L"),
        B("right_square_bracket", "next_task(1)", "Next task", "next-task", show=False, key_display="]"),
        B("left_square_bracket", "next_task(-1)", "Prev task", "prev-task", show=False, key_display="["),
        B("o", "open_node", "Open node", "open-node", show=False),
        B("d", "toggle_diff", "Diff", "diff", show=False),
        B("e", "edit", "Edit", "edit"),
        B("r", "repair", "Repair", "repair"),
        B("g", "jump_best", "Best", "jump-best"),
        B("f", "next_failure", "Next fail", "next-failure"),
        B("slash", "filter", "Filter", "filter", show=False, key_display="/"),
        B("c", "collapse", "Collapse", "collapse", show=False),
        # one key, the word for what it does now (check_action shows one of the two)
        B("p", "pause_all", "Pause all", "pause-all"),
        B("p", "resume_all", "Resume all", "resume-all"),
        B("P", "pause_task", "Pause op", "pause-task", show=False, key_display="P"),
        B("b", "add_budget", "Budget", "add-budget"),
        B("s", "stop_task", "Stop op", "stop-task"),
        B("x", "export", "Export", "export", show=False),
        B("t", "next_theme", "Theme", "next-theme", show=False),
        B("q", "quit", "Quit", "quit"),
    ]
    BINDINGS = ACTION_BINDINGS
    THEME_NAMES = ("kforge-dark", "kforge-light", "kforge-ansi")

    def __init__(self, *, control: EngineControl | None = None, run_dir: str | None = None,
                 theme: str | None = None, settings=None, follow: bool = False,
                 make_engine: Callable[[Any, ev.EventCallback], Any] | None = None,
                 details: NodeDetails | None = None, clock: Callable[[], float] = time.time,
                 keymap: dict[str, str] | None = None) -> None:
        """settings: run this optimisation here (live); follow: watch run_dir's store. make_engine
        builds the engine for settings (default: the real Engine), also when this TUI resumes a run."""
        super().__init__()
        for t in themes.load_themes():
            self.register_theme(t)
        self.theme = themes.resolve(theme, self.available_themes)
        self.keymap = check_keymap(keymap or {})
        self.set_keymap(self.keymap)
        self.control = control  # a fixed EngineControl (tests, scripted runs); else routed per command
        self.run_dir = run_dir
        self.settings = settings
        self.make_engine = make_engine or _real_engine
        self.follow = follow
        self.clock = clock
        self.details = details if details is not None else NodeDetails(run_dir)
        self.model = RunModel()
        self.task_id: str | None = None
        self.node_id: int | None = None
        self.diff = False
        self.paused_all = False  # what `p` does next; follows the model when the engine reports
        self.flushes = 0  # batches drawn: lets tests and the bench wait for "screen updated"
        self.host: EngineThread | None = None  # our own engine, when this TUI owns the run
        self.engine_error: BaseException | None = None
        self._queue: list[ev.Event] = []
        self._footer_seen: tuple | None = None
        self._open_pending = False
        self._model_paused = False
        self._ending = False
        self._follow_worker: Worker | None = None
        self._store_control = None
        self._steer_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kforge-steer")

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
        if self.settings is not None:
            self._start_engine(self.settings)

    def _w(self, selector):
        """Main-screen widget lookup that works while a modal screen is on top."""
        return self.screen_stack[0].query_one(selector)

    # ------------------------------------------------------------------ event intake
    def sink(self, event: ev.Event) -> None:
        """The EventCallback handed to the engine; safe from the engine's thread."""
        self.post_message(EngineEvent(event))

    def on_engine_event(self, message: EngineEvent) -> None:
        self._queue.append(message.event)

    def on_engine_batch(self, message: EngineBatch) -> None:
        self._queue.extend(message.events)

    def feed(self, events: list[ev.Event]) -> None:
        """Queue events directly (scripted streams)."""
        self._queue.extend(events)

    # ------------------------------------------------------------------ the engine, on its own thread
    def _start_engine(self, settings) -> None:
        self.host = EngineThread(lambda sink: self.make_engine(settings, sink), self.sink)
        self._host_engine(self.host)

    @work(thread=True, exclusive=True, group="engine", exit_on_error=False)
    def _host_engine(self, host: EngineThread) -> Any:
        return host.run()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.group != "engine":
            return
        if event.state == WorkerState.ERROR:
            err = event.worker.error
            msg = _first_line(err) if err is not None else "unknown error"
            self.notify(f"engine stopped: {msg}", severity="error", timeout=10)
            if self.run_dir and _owned(self.run_dir):  # another process took the run first: watch it
                self.follow = True
                self._start_follow()
            else:  # queued, so it lands after the events the engine sent before failing
                self.engine_error = err
                self._queue += [ev.LogLine(level="error", message=f"engine stopped: {msg}"),
                                ev.Phase(name="failed", detail=msg), ev.RunFinished(summary={"error": msg})]
        if event.state in (WorkerState.SUCCESS, WorkerState.ERROR, WorkerState.CANCELLED) and self._ending:
            self.exit(0)

    # ------------------------------------------------------------------ follow mode
    def _start_follow(self) -> None:
        from kforge_tui.follow import StoreFollower

        try:
            follower = StoreFollower(self.run_dir)
        except Exception as e:
            self.notify(_first_line(e), severity="error", timeout=15)
            return
        self._follow_worker = self._follow(follower)

    @work(thread=True, exclusive=True, group="follow", exit_on_error=False)
    def _follow(self, follower) -> None:
        """Poll the store on this thread; post what changed as one batch message per poll."""
        worker = get_current_worker()
        try:
            while not worker.is_cancelled:
                try:
                    events = follower.poll()
                except Exception as e:  # a store mid-write or vanished: say so, keep the screen
                    self.post_message(EngineEvent(ev.LogLine(level="warning",
                                                             message=f"store read failed: {_first_line(e)}")))
                    events = []
                if events:
                    self.post_message(EngineBatch(events))
                    if any(isinstance(e, ev.RunFinished) for e in events):
                        self.call_later(self._owner_gone)  # via the message queue: after this batch
                end = time.monotonic() + FOLLOW_S
                while time.monotonic() < end and not worker.is_cancelled:
                    time.sleep(0.05)
        finally:
            follower.close()

    def _owner_gone(self) -> None:
        """The run we follow ended. Commands it never took (budget, an edit) still wait in the
        store: resume the run here so they are carried out rather than silently dropped."""
        from kforge_tui.store import RunStore, owner_pid

        if self.host is not None or not self.run_dir or owner_pid(self.run_dir) is not None:
            return
        try:
            with RunStore.open(self.run_dir, readonly=True) as store:
                waiting = [c for c in store.untaken_commands() if c["name"] in WORK_COMMANDS]
        except Exception:
            return
        if waiting:
            self.notify(f"the run ended before taking {len(waiting)} of your commands; resuming it here",
                        timeout=10)
            self._become_owner()

    def _become_owner(self) -> None:
        """Resume the run in this process (its engine on our thread) and stop following the store."""
        from kforge_tui.engine import settings_for_resume

        if self.host is not None and not self.host.join(0):
            return
        try:
            settings = settings_for_resume(self.run_dir)
        except Exception as e:
            self.notify(f"could not resume the run: {_first_line(e)}", severity="error", timeout=12)
            return
        settings.serve = True  # keep evaluating edits until the user quits
        if self._follow_worker is not None:
            self._follow_worker.cancel()
            self._follow_worker = None
        self.follow = False
        self._start_engine(settings)

    # ------------------------------------------------------------------ drawing
    def flush(self) -> None:
        """Fold the queued events into the model and redraw only what they changed."""
        if (not self._queue and not self._open_pending) or not self._main_ready():
            return
        batch, self._queue = self._queue, []
        failures = self.model.llm_failures
        d = Dirty()
        for e in batch:
            self.model.apply(e, d)
            if isinstance(e, ev.RunStarted) and e.run_dir:
                self.details.run_dir = self.details.run_dir or e.run_dir
                self.run_dir = self.run_dir or e.run_dir
            if isinstance(e, ev.Phase) and e.name == "interrupted":
                self.call_later(self._owner_gone)  # commands it never took: carry them out here
        self.model.settle(d)
        if self.model.llm_failures > failures and self.model.running:  # a 429/5xx the user should see now
            self.notify(f"LLM call failed: {self.model.llm_last_error}", severity="warning", timeout=8)
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
            if self.node_id is None:
                self.call_after_refresh(self._open_default)
        if self.task_id in d.refs:  # the reference moved: every speedup shown with it, now
            tree.relabel_all(m)  # (only labels whose text changes are rebuilt)
            if self.node_id is not None and self.node_id not in d.nodes:
                self._w(LogTabs).show_timing(self.details.get(self.node_id), m.tasks[self.task_id])
        if d.header:
            self._w(StatusBar).show(m, self.clock())
            if m.paused != self._model_paused:  # the engine reported a pause or resume of everything
                self._model_paused = self.paused_all = m.paused
                self.refresh_bindings()
        if self.task_id in d.tasks:
            t = m.tasks[self.task_id]
            self._w(ProgressPlot).show(t.history, t.best_speedup)
            tree.border_subtitle = t.reason or self._ref_line(t)
        if self.node_id in d.nodes:
            self._open_pending = True
        if d.logs:
            self._w(LogTabs).show_run_log(m.logs)
        if d.tasks or d.header:
            self._footer_state()

    def _tick(self) -> None:
        if not self._main_ready():
            return
        if self.model.running:
            self._w(StatusBar).show(self.model, self.clock())
        tree = self._w(SearchTree)
        t = self.model.tasks.get(self.task_id) if self.task_id else None
        if t is not None:  # the pane's width follows the terminal's
            tree.border_title = tree_title(t, tree.size.width)

    @staticmethod
    def _ref_line(t) -> str:
        """Under the tree: the reference every speedup in it divides (the root's figure)."""
        if not t.eager_us:
            return ""
        comp = f", compile {fmt_us(t.compiled_us, compact=True)}" if t.compiled_us else ""
        clock = f" [{t.eager.clock}]" if t.eager.clock else ""
        return (f"eager ref {fmt_us(t.eager_us, compact=True)}{clock} "
                f"±{t.eager.spread or 0:.0%} n={t.eager.n}{comp}")

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
        tree.border_title = tree_title(t, tree.size.width)
        tree.border_subtitle = t.reason or self._ref_line(t)
        self._w(ProgressPlot).show(t.history, t.best_speedup)
        table = self._w(ProfileTable)
        if table.task_at_cursor() != task_id and task_id in table.rows:
            table.move_cursor(row=table.get_row_index(task_id))
        self.node_id = None
        self.call_after_refresh(self._open_default)  # once the tree has laid out its lines

    def _open_default(self) -> None:
        """Open the task's best node, else its root: a run never opens on an empty source pane."""
        t = self.model.tasks.get(self.task_id) if self.task_id else None
        if t is None or not t.node_ids or self.node_id is not None or not self._main_ready():
            return
        nid = t.best_node if t.best_node is not None else t.node_ids[0]
        if self._w(SearchTree).select_node_id(nid):
            self.open_node(nid)

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
        logs.show_node(row, self.model.tasks.get(n.task_id) if n is not None else None)
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

    # ------------------------------------------------------------------ steering
    def _steer(self, name: str, *args, done: str, what: str) -> bool:
        """Send one command to the run's owner without blocking the UI; the outcome comes back
        as a SteerResult ("could not <what>: why" on failure, never the success text first)."""
        target, resume_after = self._route(name, what)
        if target is None:
            return False

        def report(f: Future) -> None:
            err = f.exception()
            self.post_message(SteerResult(done if err is None else f"could not {what}: {_first_line(err)}",
                                          ok=err is None, become_owner=resume_after and err is None))

        self._steer_pool.submit(getattr(target, name), *args).add_done_callback(report)
        return True

    def _route(self, name: str, what: str):
        """(EngineControl to use, resume the run after sending?) — or (None, False) after telling why."""
        if self.control is not None:
            return self.control, False
        if self.host is not None and self.host.running:
            return self.host, False
        run_dir = self.run_dir or self.model.run_dir
        if not run_dir or not (Path(run_dir) / "run.db").is_file():
            self.notify("No engine attached to this view (read-only).", severity="warning")
            return None, False
        from kforge_tui.follow import StoreControl
        from kforge_tui.store import owner_pid

        owned = owner_pid(run_dir) is not None
        if not owned and name not in WORK_COMMANDS + STORED_COMMANDS:
            self.notify(f"The run is not running ({self.model.phase or 'finished'}): nothing to {what}.",
                        severity="warning")
            return None, False
        if self._store_control is None:
            self._store_control = StoreControl(run_dir)
        # unowned: work waits in the store for us to resume the run; a stop or a pause is stored
        # state that the next `kforge resume` honours
        return self._store_control, not owned and name in WORK_COMMANDS

    def on_steer_result(self, message: SteerResult) -> None:
        self.notify(message.text, severity="information" if message.ok else "error",
                    timeout=5 if message.ok else 12)
        if message.become_owner:
            self.notify("Nobody runs this search any more: this TUI resumes it to carry that out "
                        "(quitting asks first).", timeout=10)
            self._become_owner()

    # ------------------------------------------------------------------ actions
    def _need_task(self) -> str | None:
        if self.task_id is None:
            self.notify("No task selected yet.", severity="warning")
        return self.task_id

    def _label(self, tid: str) -> str:
        t = self.model.tasks[tid]
        return f"{t.op} {'x'.join(map(str, t.shape))}"

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.ACTION_BINDINGS, self.keymap))

    def action_focus_pane(self, name: str) -> None:
        if name == "logs":
            self._w(LogTabs).focus_active()
        else:
            self._w(f"#{name}").focus()

    def action_next_log(self, step: int) -> None:
        self._w(LogTabs).cycle(step)

    def show_log_tab(self, tab_id: str) -> None:
        logs = self._w(LogTabs)
        logs.active = tab_id
        logs.focus_active()

    def action_zoom(self) -> None:
        """Give the focused pane the whole screen (lazygit/k9s style); again to go back."""
        screen = self.screen_stack[0]
        zoomed = [c for c in screen.classes if c.startswith("zoom-")]
        if zoomed:
            screen.remove_class(*zoomed)
            return
        pane = self._focused_pane() or "source"
        screen.add_class(f"zoom-{pane}")
        self.notify(f"{pane} zoomed; z again restores the layout", timeout=3)

    def _focused_pane(self) -> str | None:
        node = self.focused
        while node is not None:
            if node.id in PANES:
                return node.id
            node = node.parent
        return None

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
        shown = self.model.nodes.get(parent)
        # a re-timing (the best after its confirmation) stands for the kernel it re-timed: the
        # engine files the child under that tree node, so the title and messages name it too
        parent = (retimed_node(shown.action) if shown is not None else None) or parent
        backend = self.model.device or None

        def done(source: str | None) -> None:
            if source is None:
                return
            saved = self._save_edit(parent, source, lexer_for(backend, source))
            kept = f" (kept in {saved})" if saved else ""  # every outcome says where the text is
            self._steer("submit_source", tid, parent, source, done=f"submitted a hand-written child of #{parent}{kept}",
                        what=f"submit your kernel{kept}")

        line = result_of(row).get("error_line")
        title = (f"editing #{parent} — ctrl+s submits a hand-written child, ctrl+g goes to a line, "
                 "f7 selects all, esc cancels")
        self.push_screen(EditorScreen(row["source"], title, backend, line=line), done)

    def _save_edit(self, parent: int, source: str, lexer: str) -> Path | None:
        """Write the edited kernel under RUN_DIR/edits/ (0600) before anything can fail."""
        run_dir = self.run_dir or self.model.run_dir
        if not run_dir:
            return None
        from kforge_tui.config import private_dir

        try:
            folder = private_dir(Path(run_dir) / "edits")
            path = folder / f"from-{parent}-{datetime.now():%Y%m%d-%H%M%S-%f}.{EXTENSIONS.get(lexer, 'txt')}"
            path.touch(mode=0o600)
            path.write_text(source)
        except OSError as e:
            self.notify(f"could not save your kernel under {run_dir}: {e.strerror}", severity="error")
            return None
        return path

    def action_repair(self) -> None:
        n = self.model.nodes.get(self.node_id) if self.node_id is not None else None
        if n is None or not n.failed:
            self.notify("Repair needs a failed node: open one (f jumps to the next failure).", severity="warning")
            return
        self._steer("repair", n.task_id, n.node_id, done=f"repair of #{n.node_id} requested",
                    what=f"request a repair of #{n.node_id}")

    def check_action(self, action: str, parameters) -> bool | None:
        """The footer names what each key does now: `p` is Pause all or Resume all, whichever
        applies (with nothing left to search it stays Pause all, which says so when pressed)."""
        resume = self.paused_all and self._work_left()
        if action == "pause_all":
            return not resume
        if action == "resume_all":
            return resume
        return True

    def _work_left(self) -> bool:
        return any(not t.finished for t in self.model.tasks.values())

    def _footer_state(self) -> None:
        """Re-check the footer's keys when what they can do changed (not on every batch)."""
        state = (self._work_left(), self.paused_all)
        if state != self._footer_seen:
            self._footer_seen = state
            self.refresh_bindings()

    def action_pause_all(self) -> None:
        if not any(not t.finished for t in self.model.tasks.values()):
            self.notify("No op is searching: nothing to pause.", severity="warning")
            return
        self._steer("pause", None, done="search paused (in-flight evaluations finish)",
                    what="pause the search")
        self.paused_all = True
        self.refresh_bindings()

    def action_resume_all(self) -> None:
        self._steer("resume", None, done="search resumed", what="resume the search")
        self.paused_all = False
        self.refresh_bindings()

    def action_pause_task(self) -> None:
        tid = self._need_task()
        if tid is None:
            return
        t = self.model.tasks[tid]
        if t.finished:
            self.notify(f"{self._label(tid)} is {t.state} ({t.reason}): nothing to pause. "
                        "b adds budget, e edits a node.", severity="warning")
        elif t.status == "paused":
            self._steer("resume", tid, done=f"{self._label(tid)} resumed", what=f"resume {self._label(tid)}")
        else:
            self._steer("pause", tid, done=f"{self._label(tid)} paused", what=f"pause {self._label(tid)}")

    def action_add_budget(self) -> None:
        tid = self._need_task()
        if tid is None:
            return
        t = self.model.tasks[tid]
        if t.exhausted:
            self.notify(f"{self._label(tid)}: {t.detail}. More budget would run nothing: edit a node (e) "
                        "or repair a failed one (r).", severity="warning", timeout=10)
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
            self._steer("add_budget", tid, extra, done=f"{self._label(tid)}: +{extra} candidates",
                        what=f"add budget to {self._label(tid)}")

        self.push_screen(PromptScreen(f"Extra candidates for {self._label(tid)}:", str(DEFAULT_BUDGET_STEP)), done)

    def action_stop_task(self) -> None:
        tid = self._need_task()
        if tid is None:
            return
        t = self.model.tasks[tid]
        if t.finished or t.status == "stopping":
            self.notify(f"{self._label(tid)} is already {t.state}.", severity="warning")
            return
        if self._steer("stop_task", tid, done=f"{self._label(tid)}: stop sent; it stays stopped after a resume",
                       what=f"stop {self._label(tid)}"):
            self.model.mark_stopping(tid)  # the row says so now, not when the owner answers
            self._w(ProfileTable).upsert(t)
            if tid == self.task_id:
                self._w(SearchTree).border_subtitle = t.reason

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
            self.call_from_thread(self.notify, f"export failed: {_first_line(e)}", severity="error", timeout=10)
        else:
            self.call_from_thread(self.notify, f"exported winners to {out_dir}")

    def action_next_theme(self) -> None:
        names = self.THEME_NAMES
        i = names.index(self.theme) if self.theme in names else -1
        self.theme = names[(i + 1) % len(names)]

    def watch_theme(self, _old: str, _new: str) -> None:
        if self.is_mounted and getattr(self, "node_id", None) is not None:
            self._open_pending = True  # re-render the source in the new theme's syntax colours

    # ------------------------------------------------------------------ quitting
    async def action_quit(self) -> None:
        m = self.model
        own = self.host is not None and self.host.running
        if self._ending:  # q again while the end-to-end check runs
            self.push_screen(ConfirmScreen("The end-to-end check is running. Stop it and quit now?"),
                             lambda yes: yes and self.host.cancel())
        elif own and m.searching:
            self.push_screen(ConfirmScreen(
                "A search is running. Quit? Evaluated candidates are already in the store; "
                f"`kforge resume {self.run_dir or m.run_dir}` continues it."),
                lambda yes: yes and self._close_engine(finish=False))
        elif own:
            verified = any(t.best_node is not None for t in m.tasks.values())
            if verified and (m.settings or {}).get("end_to_end", True):
                self.push_screen(ChoiceScreen(
                    "The search is over. Check the patched model end to end before quitting, "
                    "as --headless does?",
                    [("y", "check, then quit", True), ("n", "quit now (kforge apply later)", False)]),
                    lambda check: check is not None and self._close_engine(finish=True, end_to_end=check))
            else:
                self._close_engine(finish=True, end_to_end=False)
        elif self.follow and m.running and self.run_dir and _owned(self.run_dir):
            self.push_screen(ConfirmScreen("The run keeps going in its own process; quit this view?"),
                             lambda yes: yes and self.exit(0))
        else:
            self.exit(0)

    def _close_engine(self, *, finish: bool, end_to_end: bool = False) -> None:
        """finish: let the engine end the run (the end-to-end check if asked, the summary); else
        stop it as Ctrl-C would. Either way the app exits once the engine thread is done."""
        self._ending = True
        if finish:
            if end_to_end:
                self.notify("checking the patched model end to end; q again stops it", timeout=10)
            self._steer_pool.submit(self.host.request_stop, end_to_end).add_done_callback(
                lambda f: f.exception() is not None and self.host.cancel())
        else:
            self.host.cancel()

    def on_unmount(self) -> None:
        if self._follow_worker is not None:
            self._follow_worker.cancel()
        if self.host is not None and not self.host.join(0):
            self.host.cancel()  # never leave an engine running (or a store "running") behind
            self.host.join(30)
        self._steer_pool.shutdown(wait=True)
        if self._store_control is not None:
            self._store_control.close()
        self.details.close()


def _real_engine(settings, sink):
    from kforge_tui.engine import Engine

    return Engine(settings, sink)


def _owned(run_dir: str) -> bool:
    from kforge_tui.store import owner_pid

    return owner_pid(run_dir) is not None


def check_keymap(keymap: dict[str, str]) -> dict[str, str]:
    """The config's [keymap]: every id must name a binding; a typo is a one-line UsageError."""
    from kforge_tui.tui.screens.help import HelpScreen

    known = {b.id for b in KforgeApp.ACTION_BINDINGS}
    for screen in (ChoiceScreen, ConfirmScreen, PromptScreen, EditorScreen, HelpScreen):
        known |= {b.id for b in screen.BINDINGS if isinstance(b, Binding) and b.id}
    unknown = sorted(set(keymap) - known)
    if unknown:
        raise UsageError(f"config [keymap]: unknown binding id(s) {', '.join(unknown)}; "
                         f"known: {', '.join(sorted(known))}")
    keymap = dict(keymap)
    if "pause-all" in keymap:  # one key, two words (Pause all / Resume all): rebinding one moves both
        keymap.setdefault("resume-all", keymap["pause-all"])
    return keymap


def run_follow(run_dir, *, theme: str | None = None, keymap: dict[str, str] | None = None) -> int:
    """`kforge tui RUN_DIR`: open a finished run, or follow (and steer) one another process runs."""
    if not (Path(run_dir) / "run.db").is_file():
        raise UsageError(f"{run_dir} is not a kforge run directory (no run.db)")
    from kforge_tui.store import RunStore

    RunStore.open(run_dir, readonly=True).close()  # one-line UsageError on a corrupt store, before the screen
    app = KforgeApp(run_dir=str(run_dir), theme=theme, follow=True, keymap=keymap)
    app.run()
    closing_report(app, str(run_dir))
    return 0


def live_app(settings, *, theme: str | None = None, keymap: dict[str, str] | None = None) -> KforgeApp:
    """The app `run_live` runs, with the engine attached; split out so tests drive the same path.

    The engine is told to keep serving after the budget is spent (`serve`): in the live TUI a
    person edits and submits kernels, or asks for repairs, after the search ended; quitting ends it.
    """
    settings.serve = True
    return KforgeApp(run_dir=settings.run_dir, theme=theme, keymap=keymap, settings=settings)


def run_live(settings, *, theme: str | None = None, resume: bool = False,
             keymap: dict[str, str] | None = None) -> int:
    """`kforge optimize` / `kforge resume` without --headless; prints the run's summary on exit.

    `resume` only confirms what `settings_for_resume` already set (the CLI passes it).
    """
    if resume:
        settings.resume = True
    app = live_app(settings, theme=theme, keymap=keymap)
    app.run()
    return closing_report(app, settings.run_dir or app.run_dir)


def closing_report(app: KforgeApp, run_dir: str | None) -> int:
    """After the screen closes: the summary table and what to do next, as the headless path prints;
    the exit code says whether anything verified (DESIGN.md: 1 when the work failed). Closing a
    view of a run another process still runs says that it goes on, and how to come back."""
    if app.engine_error is not None:
        raise app.engine_error  # the CLI prints it in one line, with its exit code
    if not run_dir or not (Path(run_dir) / "run.db").is_file():
        return 0
    from kforge_tui.summary import format_attached_close, format_next_steps, format_show, show_json

    data = show_json(run_dir)
    if app.host is None and data.get("owner_pid"):
        print(format_attached_close(data, data["owner_pid"]))
        return 0
    print(format_show(data))
    print(format_next_steps(data))
    if app.host is None and data.get("status") == "interrupted":
        return 0  # a viewer of a killed run: nothing failed here
    return 0 if any(t["verified"] for t in data["tasks"]) else 1
