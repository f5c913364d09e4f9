"""Settings of the Django test project: the example project's (examples/django) on the test
database, plus a SQLite alias for the system-check tests. Read the environment
(TENURE_DSN, TENURE_SCHEMA, DJANGO_SEARCH_PATH) when imported."""

import sys

from ..support.examples import EXAMPLES

sys.path.insert(0, str(EXAMPLES / "django"))

from mysite.settings import *  # noqa: F403
from mysite.settings import DATABASES as _DATABASES

DATABASES = {**_DATABASES, "other": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
LOGGING_CONFIG = None  # the test process keeps pytest's logging
