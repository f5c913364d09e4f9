"""The ``tenure`` command group. Every option has a ``TENURE_*`` environment twin, shown in --help.

Each command lives in the module of its capability (core, exec, scheduler, outbox,
observability, verify, ui) and is registered here; those modules import :mod:`.common`, never
this one.
Heavy imports (psycopg, rich) happen inside the commands that need them, so that
``tenure exec`` in a crontab starts fast.
"""

from __future__ import annotations

import click

from . import core, observability
from .common import CONTEXT, TenureGroup
from .exec import exec_command
from .grants import grants
from .outbox import outbox, relay
from .prune import prune
from .scheduler import jobs, worker
from .schedules import schedules
from .ui import ui
from .verify import verify_command


@click.group(cls=TenureGroup, context_settings=CONTEXT)
@click.version_option(package_name="tenure")
def cli() -> None:
    """tenure: scheduled jobs that stay correct when several instances run them.

    PostgreSQL leases with fencing tokens: every takeover of a job increments its token, and
    every fenced write refuses tokens older than the last one accepted, so an executor that
    was paused past its lease can never commit a result older than its successor's.

    \b
    Start here:
      tenure demo                      the seed scenario, live (embedded PostgreSQL if no DSN)
      tenure migrate                   create or upgrade tenure's tables
      tenure grants --role app         the GRANTs an application role needs (least privilege)
      tenure exec --key K -- CMD       run a command under a fenced lease (cron, k8s, systemd)
      tenure worker myapp:app          run a tenure.Scheduler's cron jobs, once per slot
      tenure schedules add K --task T  a runtime schedule of a task, live on every worker
      tenure relay --webhook T=URL     deliver outbox messages, at least once
      tenure status                    every job: holder token, expiry, runs, failures, p95
      tenure doctor                    check DSN, connectivity, schema, clocks, PgBouncer
      tenure verify                    prove the guarantee on your deployment, under faults
      tenure ui                        web dashboard: jobs, leases, takeovers, live
      tenure prune --dry-run           history retention (workers and relays also prune)
    """


for command in (
    core.demo,
    core.migrate,
    grants,
    observability.status,
    core.release,
    core.result,
    core.embedded,
    exec_command,
    relay,
    outbox,
    prune,
    worker,
    jobs,
    schedules,
    observability.doctor,
    verify_command,
    ui,
):
    cli.add_command(command)


def main() -> None:
    cli()
