"""`raftsched schedules create|list|get|edit|pause|resume|trigger|backfill|occurrences|delete`."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from raftsched import timefmt
from raftsched.cli._common import EXIT_OK, print_fields, print_json, print_table, with_client
from raftsched.client import Client, JsonObject

SCHEDULE_COLUMNS = [
    ("ID", "id"),
    ("CRON", "cron"),
    ("INTERVAL S", "interval_s"),
    ("TZ", "timezone"),
    ("OVERLAP", "overlap"),
    ("PAUSED", "paused"),
    ("NEXT FIRE", "next_fire_at"),
    ("LAST FIRED", "last_fired_at"),
]
SCHEDULE_FIELDS = [
    "id", "cron", "interval_s", "timezone", "start_at", "end_at", "jitter_s", "overlap",
    "catchup", "paused", "job", "created_at", "updated_at", "next_fire_at",
    "next_nominal_time", "last_fired_at", "running", "running_job_ids", "buffered", "counts",
    "last_lag_s",
]  # fmt: skip
OCCURRENCE_COLUMNS = [
    ("NOMINAL", "nominal_time"),
    ("DECIDED", "decided_at"),
    ("DECISION", "decision"),
    ("JOB", "job_id"),
    ("REASON", "reason"),
]
OVERLAP = ["skip", "buffer_one", "buffer_all", "allow_all", "cancel_other"]


def register(commands: argparse._SubParsersAction[Any], common: argparse.ArgumentParser) -> None:
    schedules = commands.add_parser("schedules", help="recurring schedules")
    actions = schedules.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, help_text in (("create", "create a schedule"), ("edit", "replace a schedule")):
        parser = actions.add_parser(name, parents=[common], help=help_text)
        _definition_options(parser, editing=name == "edit")
        parser.set_defaults(run=with_client(create if name == "create" else edit))
    listing = actions.add_parser("list", parents=[common], help="schedules by id")
    listing.add_argument("--limit", type=int, default=50)
    listing.add_argument("--cursor")
    listing.set_defaults(run=with_client(list_all))
    simple: list[tuple[str, str, Callable[[argparse.Namespace, Client], int]]] = [
        ("get", "one schedule", get),
        ("pause", "stop firing", pause),
        ("resume", "fire again from the next occurrence", resume),
        ("trigger", "an occurrence now (obeys the overlap policy)", trigger),
        ("delete", "delete a schedule", delete),
    ]
    for name, help_text, run in simple:
        parser = actions.add_parser(name, parents=[common], help=help_text)
        parser.add_argument("schedule_id")
        parser.set_defaults(run=with_client(run))
    backfill_parser = actions.add_parser("backfill", parents=[common], help="run a past range")
    backfill_parser.add_argument("schedule_id")
    backfill_parser.add_argument("--from", dest="start", required=True, type=_time_arg)
    backfill_parser.add_argument("--to", dest="end", required=True, type=_time_arg)
    backfill_parser.add_argument("--overlap", choices=OVERLAP)
    backfill_parser.set_defaults(run=with_client(backfill))
    history = actions.add_parser("occurrences", parents=[common], help="decided occurrences")
    history.add_argument("schedule_id")
    history.add_argument("--limit", type=int, default=50)
    history.set_defaults(run=with_client(occurrences))


def _definition_options(parser: argparse.ArgumentParser, *, editing: bool) -> None:
    parser.add_argument("schedule_id", nargs=None if editing else "?", help="the id")
    when = parser.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", help="5 fields, or 6 with seconds first")
    when.add_argument("--interval-s", type=float)
    parser.add_argument("--queue", required=True, help="queue of the jobs it creates")
    parser.add_argument("--payload", type=_json_arg, help="JSON payload of each job")
    parser.add_argument("--timezone", help="IANA zone (default UTC)")
    parser.add_argument("--start-at", type=_time_arg)
    parser.add_argument("--end-at", type=_time_arg)
    parser.add_argument("--jitter-s", type=float)
    parser.add_argument("--overlap", choices=OVERLAP)
    parser.add_argument("--catchup", choices=["skip", "latest", "all"], help="missed-run policy")
    parser.add_argument("--catchup-window-s", type=float)
    parser.add_argument("--catchup-max-runs", type=int)
    parser.add_argument("--paused", action="store_true", help="create it paused")
    parser.add_argument("--job", type=_json_arg, help="full job template as JSON (overrides)")


def _body(args: argparse.Namespace) -> JsonObject:
    job: JsonObject = {"queue": args.queue}
    if args.payload is not None:
        job["payload"] = args.payload
    if args.job is not None:
        job.update(args.job)
    catchup = {
        key: value
        for key, value in (
            ("policy", args.catchup),
            ("window_s", args.catchup_window_s),
            ("max_runs", args.catchup_max_runs),
        )
        if value is not None
    }
    fields = {
        "id": args.schedule_id,
        "cron": args.cron,
        "interval_s": args.interval_s,
        "timezone": args.timezone,
        "start_at": args.start_at,
        "end_at": args.end_at,
        "jitter_s": args.jitter_s,
        "overlap": args.overlap,
        "catchup": catchup or None,
        "paused": True if args.paused else None,
        "job": job,
    }
    return {key: value for key, value in fields.items() if value is not None}


def _show(args: argparse.Namespace, schedule: JsonObject) -> int:
    if args.json:
        print_json(schedule)
    else:
        print_fields(schedule, SCHEDULE_FIELDS)
    return EXIT_OK


def create(args: argparse.Namespace, client: Client) -> int:
    return _show(args, client.create_schedule(_body(args)))


def edit(args: argparse.Namespace, client: Client) -> int:
    return _show(args, client.update_schedule(args.schedule_id, _body(args)))


def get(args: argparse.Namespace, client: Client) -> int:
    return _show(args, client.get_schedule(args.schedule_id))


def pause(args: argparse.Namespace, client: Client) -> int:
    return _show(args, client.pause_schedule(args.schedule_id))


def resume(args: argparse.Namespace, client: Client) -> int:
    return _show(args, client.resume_schedule(args.schedule_id))


def delete(args: argparse.Namespace, client: Client) -> int:
    answer = client.delete_schedule(args.schedule_id)
    if args.json:
        print_json(answer)
    else:
        print(f"deleted {args.schedule_id}")
    return EXIT_OK


def list_all(args: argparse.Namespace, client: Client) -> int:
    page = client.list_schedules(limit=args.limit, cursor=args.cursor)
    if args.json:
        print_json(page)
        return EXIT_OK
    print_table(page["schedules"], SCHEDULE_COLUMNS)
    if page.get("next_cursor"):
        print(f"more: --cursor {page['next_cursor']}")
    return EXIT_OK


def _occurrence_table(args: argparse.Namespace, records: list[JsonObject]) -> int:
    if args.json:
        print_json({"occurrences": records})
    else:
        print_table(records, OCCURRENCE_COLUMNS)
    return EXIT_OK


def trigger(args: argparse.Namespace, client: Client) -> int:
    return _occurrence_table(args, [client.trigger_schedule(args.schedule_id)])


def backfill(args: argparse.Namespace, client: Client) -> int:
    records = client.backfill_schedule(args.schedule_id, args.start, args.end, overlap=args.overlap)
    return _occurrence_table(args, records)


def occurrences(args: argparse.Namespace, client: Client) -> int:
    return _occurrence_table(args, client.schedule_occurrences(args.schedule_id, limit=args.limit))


def _json_arg(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON: {error}") from error


def _time_arg(text: str) -> str:
    try:
        return timefmt.normalize(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error
