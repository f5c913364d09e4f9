"""``manage.py tenure_migrate``: create or upgrade tenure's schema in the project database."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from tenure.contrib.django.db import conninfo, settings
from tenure.errors import TenureError


class Command(BaseCommand):
    help = (
        "Create or upgrade tenure's schema (settings.TENURE['SCHEMA'], default 'tenure') in "
        "the database of settings.TENURE['DATABASE'] (default 'default'). Safe to run from "
        "several hosts at once."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--database", default=None, help="DATABASES alias (default: TENURE['DATABASE'])."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from tenure.leases._sync.client import connect

        config = settings()
        try:
            with connect(conninfo(options["database"]), schema=config.schema) as client:
                applied = client.migrate()
        except TenureError as exc:
            raise CommandError(str(exc)) from None
        if applied:
            versions = ", ".join(str(v) for v in applied)
            self.stdout.write(f"tenure schema {config.schema!r}: applied {versions}")
        else:
            self.stdout.write(f"tenure schema {config.schema!r}: up to date")
