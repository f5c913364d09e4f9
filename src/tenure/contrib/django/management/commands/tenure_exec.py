"""``manage.py tenure_exec``: run a management command under a tenure lease, at most once per
slot with ``--every``/``--slot``: ``tenure exec`` for Django commands, on the project's
database and in-process (no second DSN, no second interpreter)."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management import call_command, get_commands
from django.core.management.base import BaseCommand, CommandError

from tenure.contrib.django.db import conninfo, settings
from tenure.errors import InvalidArgument, LeaseLost, TenureError
from tenure.exec.slots import check_period, check_slot
from tenure.guard import Guard
from tenure.validation import check_job_key, check_ttl, parse_duration


class Command(BaseCommand):
    help = (
        "Run COMMAND (a management command) under the lease KEY: at once at a time across "
        "hosts, and with --every/--slot at most once per slot (the same slot rules as "
        "`tenure exec`). Busy or already done: says so and exits 0. Example, in a CronJob "
        "every 5 minutes: manage.py tenure_exec --key clearsessions --every 5m -- "
        "clearsessions"
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--key", required=True, help="Job key (one lease per key).")
        parser.add_argument("--ttl", default="30s", help="Lease TTL, renewed every ttl/3.")
        parser.add_argument(
            "--every",
            default=None,
            help="Slot = the period (whole seconds, e.g. 5m) the database clock is in, from 2s "
            "before its start.",
        )
        parser.add_argument("--slot", default=None, help="Slot name (e.g. the scheduled time).")
        parser.add_argument(
            "--database", default=None, help="DATABASES alias (default: TENURE['DATABASE'])."
        )
        parser.add_argument(
            "command_args",
            nargs=argparse.REMAINDER,
            metavar="-- COMMAND [ARGS]",
            help="The management command to run and its arguments.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        command = list(options["command_args"])
        if command[:1] == ["--"]:
            command = command[1:]
        if not command:
            raise CommandError("no command to run: manage.py tenure_exec --key KEY -- COMMAND")
        if command[0] not in get_commands():
            raise CommandError(f"unknown management command {command[0]!r}", returncode=2)
        try:
            guard = Guard(
                check_job_key(options["key"]),
                every=None
                if options["every"] is None
                else check_period(parse_duration(options["every"], what="--every")),
                slot=None if options["slot"] is None else check_slot(options["slot"]),
                ttl=check_ttl(options["ttl"]),
                dsn=conninfo(options["database"]),
                schema=settings().schema,
            )
            attempt = guard.attempt(call_command, False, tuple(command), {})
        except InvalidArgument as exc:
            raise CommandError(str(exc), returncode=2) from None
        except LeaseLost as exc:
            raise CommandError(f"{exc}; {command[0]!r} may have been cut short") from None
        except TenureError as exc:
            raise CommandError(str(exc)) from None
        where = f" slot {attempt.slot}" if attempt.slot else ""
        if attempt.outcome == "busy":
            self.stderr.write(f"{options['key']!r} is busy: not running {command[0]!r}")
        elif attempt.outcome == "already_done":
            self.stderr.write(f"{options['key']!r}{where} already done: not running {command[0]!r}")
        else:
            self.stderr.write(f"{options['key']!r}{where} ran with token {attempt.token}")
