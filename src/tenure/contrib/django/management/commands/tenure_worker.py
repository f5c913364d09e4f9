"""``manage.py tenure_worker``: run the jobs that installed apps declare in their ``jobs.py``."""

from __future__ import annotations

import logging
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils.module_loading import autodiscover_modules

from tenure.contrib.django.db import conninfo, settings
from tenure.contrib.django.scheduling import scheduler
from tenure.errors import TenureError


class Command(BaseCommand):
    help = (
        "Run the tenure jobs declared with @scheduler.job(...) in each installed app's jobs.py "
        "(from tenure.contrib.django import scheduler). Start it on as many hosts as you "
        "like: each job runs once per slot. SIGTERM: stop claiming, let running jobs finish "
        "(--shutdown-grace), hand the rest over; a second SIGTERM cancels them at once."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--database", default=None, help="DATABASES alias (default: TENURE['DATABASE'])."
        )
        parser.add_argument("--concurrency", type=int, default=None, help="Most runs at once.")
        parser.add_argument(
            "--shutdown-grace", default=None, help="Time running jobs get at shutdown (30s)."
        )
        parser.add_argument(
            "--migrate", action="store_true", help="Apply tenure's migrations first."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        autodiscover_modules("jobs")
        if not scheduler.jobs:
            raise CommandError(
                "no tenure jobs found: declare them in an installed app's jobs.py with "
                "`from tenure.contrib.django import scheduler` and `@scheduler.job(...)`"
            )
        if options["verbosity"] > 0 and not _logging_configured():
            logging.basicConfig(
                level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
            )
        config = settings()
        try:
            scheduler.dsn = conninfo(options["database"])
            scheduler.schema = config.schema
            scheduler.migrate = options["migrate"]
            scheduler.run(
                concurrency=options["concurrency"], shutdown_grace=options["shutdown_grace"]
            )
        except TenureError as exc:
            raise CommandError(str(exc)) from None


def _logging_configured() -> bool:
    """Whether settings.LOGGING (or anything) already sends tenure's records somewhere."""
    loggers = [logging.getLogger("tenure"), logging.getLogger()]
    return any(not isinstance(h, logging.NullHandler) for lg in loggers for h in lg.handlers)
