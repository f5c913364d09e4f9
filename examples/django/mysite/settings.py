"""Settings of the example project: one PostgreSQL database (psycopg 3), tenure as an app.

TENURE_DSN (default: local PostgreSQL) and TENURE_SCHEMA (default "tenure") choose where it
runs; with DJANGO_SEARCH_PATH set, the project's own tables go to that schema.
"""

import os

from psycopg.conninfo import conninfo_to_dict

_dsn = conninfo_to_dict(
    os.environ.get("TENURE_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
)
_search_path = os.environ.get("DJANGO_SEARCH_PATH")

SECRET_KEY = "example-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "mysite.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "tenure.contrib.django",
    "invoices",
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _dsn.get("dbname", "postgres"),
        "USER": _dsn.get("user", ""),
        "PASSWORD": _dsn.get("password", ""),
        "HOST": _dsn.get("host", ""),
        "PORT": _dsn.get("port", ""),
        "OPTIONS": {"options": f"-c search_path={_search_path}"} if _search_path else {},
    }
}

# Where tenure keeps its leases, tokens and slots (the defaults: "default" and "tenure").
TENURE = {"DATABASE": "default", "SCHEMA": os.environ.get("TENURE_SCHEMA", "tenure")}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"tenure": {"handlers": ["console"], "level": "INFO"}},
}
