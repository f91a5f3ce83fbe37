"""Following a task from the terminal (`deckhands run`, `deckhands logs -f`): its events as they
come, a live status line, the confirmations and questions it asks, and the exit code its final
state gives."""

from __future__ import annotations

import json
import time
from typing import Any

from rich.live import Live
from rich.prompt import Confirm, Prompt
from rich.text import Text

from .client import ENDED_STATES, ApiError, Client, is_terminal
from .common import Exit, call, console, err_console, fail
from .render import event_renderable, status_line

__all__ = ["Follower"]

_BY_STATE = {
    "FINISHED": Exit.FINISHED,
    "ERROR": Exit.ERROR,
    "STOPPED": Exit.STOPPED,
    "REJECTED": Exit.REJECTED,
    "AWAITING_USER_INPUT": Exit.AWAITS_INPUT,
}


class Follower:
    """Prints a task's events as they come, with a live status line on a terminal, until the
    task ends (or waits for a person who is not at the keyboard)."""

    def __init__(
        self,
        client: Client,
        task_id: str,
        *,
        timeout_s: float | None,
        interactive: bool,
        as_json: bool = False,
    ) -> None:
        self.client = client
        self.task_id = task_id
        self.interactive = interactive
        self.as_json = as_json
        self.started = time.monotonic()
        self.deadline = None if timeout_s is None else self.started + timeout_s
        self.task: dict[str, Any] = {}
        self.live: Live | None = None
        self.hinted: set[str] = set()
        self.shown_result = ""  # the final message of the last finish event shown
        self.ended = False

    def _print(self, renderable: Any) -> None:
        (self.live.console if self.live else console).print(renderable)

    def _refresh(self) -> None:
        """The task's view again. A gateway restarting or unreachable for a moment (the
        stream reconnects meanwhile) is waited out for up to a minute."""
        give_up = time.monotonic() + 60
        while True:
            try:
                self.task = self.client.task(self.task_id)
                return
            except ApiError as exc:
                transient = exc.status == 0 or exc.status in (502, 503, 504)
                if not transient or time.monotonic() > give_up:
                    fail(str(exc), Exit.REFUSED)
                time.sleep(1)

    def __rich__(self) -> Text:
        """The live status line, drawn again 4 times a second (the clock moves)."""
        return status_line(self.task, time.monotonic() - self.started)

    def run(self, after: int = 0) -> Exit:
        try:
            self.task = call(self.client.task, self.task_id)
            if not console.is_terminal or self.as_json:
                code = self._loop(after)
            else:
                with Live(self, console=console, transient=True, refresh_per_second=4) as live:
                    self.live = live
                    code = self._loop(after)
                self.live = None
        except KeyboardInterrupt:
            # Ctrl-C leaves the task alone: it runs on the servers, not here.
            err_console.print(
                Text(
                    f"stopped following task {self.task_id}; it goes on "
                    f"(deckhands logs -f {self.task_id}, or deckhands stop {self.task_id})",
                    style="yellow",
                )
            )
            return Exit.INTERRUPTED
        if self.ended:
            self._summary()
        return code

    def _loop(self, after: int) -> Exit:
        events = self.client.follow(
            self.task_id,
            after,
            stop_at_end=False,
            deadline=self.deadline,
            # On stderr: stdout stays the events (JSON lines with --json).
            on_reconnect=lambda why: err_console.print(Text(f"[stream: {why}]", style="yellow")),
        )
        try:
            for event in events:
                if self.as_json:
                    print(json.dumps(event), flush=True)
                else:
                    self._print(event_renderable(event))
                if event.get("kind") == "finish":
                    self.shown_result = event.get("final_message", "")
                if event.get("kind") == "agent_state_changed" or event.get("llm_usage"):
                    self._refresh()
                outcome = self._after(event)
                if outcome is not None:
                    return outcome
        except TimeoutError:
            return self._timed_out()
        except ApiError as exc:
            fail(str(exc), Exit.REFUSED)
        return Exit.REFUSED  # the stream never ends by itself

    def _timed_out(self) -> Exit:
        err_console.print(
            Text(
                f"deckhands: task {self.task_id} still {self.task.get('state')} after the "
                "timeout; it goes on (follow it with `deckhands logs -f`)",
                style="yellow",
            )
        )
        return Exit.TIMEOUT

    def _after(self, event: dict[str, Any]) -> Exit | None:
        """What the task's latest state asks of us: None to go on following."""
        if event.get("kind") != "agent_state_changed":
            return None
        state = self.task.get("state", "")
        if is_terminal(event) and state in ENDED_STATES:
            return self._end()
        if state == "AWAITING_USER_CONFIRMATION" and event.get("agent_state") == state:
            self._confirm()
        elif state == "AWAITING_USER_INPUT" and event.get("agent_state") == state:
            if not self.interactive:
                self._print(
                    Text(
                        f'the agent waits for your answer: deckhands say {self.task_id} "..."',
                        style="magenta",
                    )
                )
                return Exit.AWAITS_INPUT
            self._answer()
        return None

    def _end(self) -> Exit:
        self.ended = True
        return _BY_STATE.get(self.task.get("state", ""), Exit.ERROR)

    def _summary(self) -> None:
        if self.as_json:
            return
        result = self.task.get("result")
        console.print()
        console.print(status_line(self.task, time.monotonic() - self.started))
        if result and result["final_message"] != self.shown_result:
            console.print(Text("result:", style="bold green"))
            console.print(Text(result["final_message"]))
        elif self.task.get("reason") and self.task.get("state") != "FINISHED":
            console.print(Text(f"reason: {self.task['reason']}", style="red"))

    def _confirm(self) -> None:
        pending = self.task.get("pending_action") or {}
        if not self.interactive:
            if pending.get("id") not in self.hinted:
                self.hinted.add(pending.get("id", ""))
                self._print(
                    Text(
                        f"waiting for your approval: deckhands approve {self.task_id} "
                        f"(or reject), or the web console",
                        style="magenta",
                    )
                )
            return
        if self.live:
            self.live.stop()
        try:
            console.print(Text("the agent wants to run:", style="bold magenta"))
            console.print(event_renderable(pending))
            approve = Confirm.ask("approve it?", console=console, default=False)
        finally:
            if self.live:
                self.live.start()
        call(self.client.confirm, self.task_id, pending["id"], approve)

    def _answer(self) -> None:
        if self.live:
            self.live.stop()
        try:
            answer = ""
            while not answer.strip():
                answer = Prompt.ask("[bold magenta]your answer[/bold magenta]", console=console)
        finally:
            if self.live:
                self.live.start()
        call(self.client.say, self.task_id, answer)
