"""The command line of the evaluation: progress as tasks run, then a table and a JSON report.

    python -m tools.eval [--subset headline|dev|heldout|all] [--tasks a,b] [--concurrency N]
                         [--report PATH] [--url URL --api-key-file FILE] [--timeout S]
                         [--attempts K] [--scripted solutions|cheats]

The set has a development half (the prompts and tools are tuned on it) and a held-out half
(they are not); `--subset all` runs both, and the summary gives each half's pass rate.

With --attempts K each task's set-up (its files checked out, a first look) runs once and K
forks of it attempt the task (tools/eval/attempts.py): the report gives pass@1 and pass@K.

Without --url it uses the stack `make up` started when one is running (and leaves it running),
else starts one as `make run` does (tools.stack: the LLM is DECKHANDS_LLM_MODEL's provider, or
the local model, or with DECKHANDS_STACK_LLM=scripted the scripted server) and stops it after.
Exit code 0 when the run completed (whatever the pass rate), 2 on bad options.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..stack import ROOT, Stack, StackConfig, running
from .runner import EvalReport, run_eval
from .scripted import (
    cheating_turns,
    conversation,
    setup_conversation,
    solving_turns,
    write_script,
)
from .tasks import SUBSETS, TASKS, select

__all__ = ["main", "print_report"]

DEFAULT_REPORT = ROOT / ".run" / "eval-report.json"
_HALVES = {"dev": "development half", "heldout": "held-out half"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.eval", description=__doc__)
    parser.add_argument(
        "--subset",
        choices=SUBSETS,
        default="headline",
        help="headline (10 tasks), dev or heldout (a half of the set) or all (both halves)",
    )
    parser.add_argument("--tasks", default="", help="task ids, comma-separated")
    parser.add_argument("--concurrency", type=int, default=2, help="tasks at once (default 2)")
    parser.add_argument("--report", type=Path, default=DEFAULT_REPORT, help="JSON report path")
    parser.add_argument("--url", default="", help="a running gateway (else a stack is used)")
    parser.add_argument("--api-key-file", type=Path, default=None, help="with --url")
    parser.add_argument("--timeout", type=float, default=900.0, help="per task, seconds")
    parser.add_argument(
        "--attempts",
        type=int,
        default=1,
        help="attempts per task: forks of one set-up, scored each (pass@1 and pass@k)",
    )
    parser.add_argument(
        "--scripted",
        choices=["solutions", "cheats"],
        default="solutions",
        help="on the scripted LLM server this command starts: answer each task with its "
        "reference solution (all pass) or with its cheat (all fail)",
    )
    parser.add_argument(
        "--show",
        choices=["none", "failed", "all"],
        default="none",
        help="print what the agent did (commands, output, diffs) in these tasks after the table",
    )
    return parser


def print_report(report: EvalReport, console: Console) -> None:
    table = Table(title=f"deckhands eval — {report.model}, subset {report.subset}")
    table.add_column("task", no_wrap=True, min_width=16)
    if report.attempts > 1:
        table.add_column("try", justify="right")
    table.add_column("result")
    table.add_column("state")
    table.add_column("steps", justify="right")
    table.add_column("tokens", justify="right")
    table.add_column("seconds", justify="right")
    table.add_column("why it failed", overflow="fold", max_width=50)
    for o in report.outcomes:
        why = "" if o.passed else (o.error or o.check_output.strip().splitlines()[-1:] or [""])[0]
        if not o.passed and o.error and o.check_output.strip():
            why = f"{o.error}; {o.check_output.strip().splitlines()[-1]}"
        table.add_row(
            o.id,
            *([str(o.attempt)] if report.attempts > 1 else []),
            "[green]pass[/]" if o.passed else "[red]FAIL[/]",
            o.state,
            str(o.steps),
            str(o.tokens),
            f"{o.seconds:.0f}",
            why[:200],
        )
    console.print(table)
    console.print(f"{_summary(report)} in {report.seconds:.0f}s")
    splits = report.splits
    if len(splits) > 1:  # each half's own rate, so that the held-out one is read apart
        for name, part in splits.items():
            console.print(f"  {_HALVES.get(name, name)}: {_summary(part)}")
    failed = len(report.outcomes) - report.passed
    if failed:
        what = "attempts" if report.attempts > 1 else "tasks"
        console.print(
            f"iterations spent on the {failed} failed {what}: {report.failed_iterations} "
            f"({report.failed_iterations_mean:.1f} each)"
        )


def _summary(report: EvalReport) -> str:
    if report.attempts > 1:
        return (
            f"{report.tasks} tasks x {report.attempts} attempts: pass@1 "
            f"{100 * report.pass_rate:.0f}% ({report.passed} of {len(report.outcomes)} "
            f"attempts), pass@{report.attempts} {100 * report.pass_at_k:.0f}%"
        )
    return f"passed {report.passed} of {len(report.outcomes)} ({100 * report.pass_rate:.0f}%)"


@contextmanager
def _gateway(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    if args.url:
        key_file = args.api_key_file or ROOT / ".run" / "api_key"
        yield args.url, key_file.read_text().strip()
        return
    config = StackConfig()
    if "DECKHANDS_REPOSITORY_ALLOWED_HOSTS" not in os.environ:
        # The tasks' repositories are served on loopback (repos.py), which the address policy
        # refuses unless the operator allows it: this stack is the evaluation's own.
        config.extra_env["DECKHANDS_REPOSITORY_ALLOWED_HOSTS"] = '["127.0.0.1"]'
    if config.llm == "scripted" and "DECKHANDS_STACK_LLM_SCRIPT" not in os.environ:
        # The scripted server answers each task with its reference solution, or its cheat
        # (scripted.py).
        turns = cheating_turns if args.scripted == "cheats" else solving_turns
        config.llm_script = write_script(
            config.run_dir / "eval-scripted.json",
            [
                *(setup_conversation(t, turns) for t in TASKS),
                *(conversation(t, turns(t)) for t in TASKS),
            ],
        )
    stack = Stack(config)
    if stack.running().get("gateway"):
        stack.ensure_api_key()
        yield config.gateway_url, stack.api_key
        return
    with running(config) as started:
        yield config.gateway_url, started.api_key


def main(argv: Sequence[str] | None = None) -> EvalReport:
    args = _parser().parse_args(argv)
    console = Console()
    try:
        tasks = select(args.subset, [t for t in args.tasks.split(",") if t] or None)
    except ValueError as exc:
        console.print(f"[red]{exc}[/]")
        sys.exit(2)
    if args.concurrency < 1:
        console.print("[red]--concurrency must be at least 1[/]")
        sys.exit(2)
    if not 1 <= args.attempts <= 32:
        console.print("[red]--attempts must be from 1 to 32 (forks per request)[/]")
        sys.exit(2)
    subset = "custom" if args.tasks else args.subset
    interrupted = failed = False
    with _gateway(args) as (url, api_key):
        columns = (
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=console) as progress:
            bar = progress.add_task("eval", total=len(tasks), status="")  # tasks, not attempts
            states: dict[str, str] = {}

            def on_progress(task_id: str, what: str) -> None:
                if states.get(task_id) == what:
                    return
                states[task_id] = what
                if what in ("passed", "failed"):
                    mark = "[green]pass[/]" if what == "passed" else "[red]FAIL[/]"
                    progress.console.print(f"{mark} {task_id}")
                    progress.advance(bar)
                live = [f"{t}:{s}" for t, s in states.items() if s not in ("passed", "failed")]
                progress.update(bar, status=" ".join(live)[:80])

            try:
                report = run_eval(
                    url,
                    api_key,
                    tasks,
                    subset=subset,
                    concurrency=args.concurrency,
                    timeout_s=args.timeout,
                    on_progress=on_progress,
                    attempts=args.attempts,
                )
            except RuntimeError as exc:  # no Docker engine or sandbox image for the checks
                progress.stop()
                console.print(f"[red]{exc}[/]")
                failed = True
            except KeyboardInterrupt:
                progress.stop()
                console.print("[yellow]interrupted: the running tasks were stopped[/]")
                interrupted = True
    if interrupted:
        sys.exit(130)
    if failed:
        sys.exit(1)
    print_report(report, console)
    for o in report.outcomes:
        if args.show == "all" or (args.show == "failed" and not o.passed):
            attempt = f" attempt {o.attempt}" if report.attempts > 1 else ""
            console.rule(
                f"{o.id}{attempt}: {'pass' if o.passed else 'FAIL'} ({o.state}, task {o.task_id})"
            )
            console.print(o.transcript, markup=False, highlight=False, soft_wrap=True)
            console.print(f"check (exit {o.check_exit}):", style="bold")
            console.print(
                o.check_output or "(no output)", markup=False, highlight=False, soft_wrap=True
            )
    report.write(args.report)
    console.print(f"report: {args.report}")
    return report
