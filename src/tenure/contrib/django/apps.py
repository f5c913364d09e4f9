"""The Django app configuration: ``INSTALLED_APPS = [..., "tenure.contrib.django"]``."""

from __future__ import annotations

from django.apps import AppConfig


class TenureConfig(AppConfig):
    name = "tenure.contrib.django"
    label = "tenure"
    verbose_name = "tenure (fenced leases and scheduled jobs)"

    def ready(self) -> None:
        from . import checks

        checks.register()
