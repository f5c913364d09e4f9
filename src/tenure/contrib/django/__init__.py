"""tenure as a Django app (``pip install tenure[django]``; Django 4.2+ on the psycopg 3
backend). Add ``"tenure.contrib.django"`` to ``INSTALLED_APPS``; tenure then uses the
project's ``DATABASES`` (no second DSN).

* :func:`fence` / :func:`outbox_enqueue`: inside ``transaction.atomic()``, bind the block's
  ORM writes to a fencing token; they commit together or not at all.
* :data:`scheduler`: declare jobs in each installed app's ``jobs.py`` with
  ``@scheduler.job(...)``; ``manage.py tenure_worker`` discovers and runs them.
* ``manage.py tenure_migrate`` creates or upgrades tenure's schema; ``manage.py
  tenure_exec --key K --every 5m -- COMMAND ...`` runs a management command at most once per
  slot across hosts (a CronJob that must not overlap itself).
* System checks: ``tenure.E001`` (not PostgreSQL), ``tenure.E002`` (psycopg2, not psycopg 3),
  ``tenure.W001`` (tenure's schema missing or not migrated).

Settings (all optional): ``TENURE = {"DATABASE": "default", "SCHEMA": "tenure"}``.

This package imports nothing from Django at import time; its submodules do.
"""

from __future__ import annotations

from .db import conninfo, fence, outbox_enqueue, settings
from .scheduling import DjangoScheduler, scheduler

__all__ = ["DjangoScheduler", "conninfo", "fence", "outbox_enqueue", "scheduler", "settings"]
