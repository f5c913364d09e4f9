"""db/dsn.py: what redact() hides, and resolve() refusing a DSN libpq cannot parse."""

from __future__ import annotations

import pytest

import tenure
from tenure.db import dsn


@pytest.mark.parametrize(
    ("text", "dsn_", "hidden"),
    [
        ('in URI: "postgresql://u:Pw0rd-xyz@[::1:5432/db"', None, "Pw0rd-xyz"),
        ("host=h password='it s' dbname=d", None, "it s"),
        ("host=h password=plain dbname=d", None, "plain"),
        ("postgresql://h/d?sslmode=off&password=qs-secret", None, "qs-secret"),
        ('invalid percent-encoded token: "abc%ZZdef"', "postgresql://u:abc%ZZdef@h/d", "abc"),
        ("POST to https://bot:hook-token@hooks.example/x failed", None, "hook-token"),
        ("token p@ss:word! quoted", "postgresql://u:p%40ss%3Aword%21@h/d", "p@ss:word!"),
    ],
)
def test_redact_hides_passwords(text: str, dsn_: str | None, hidden: str) -> None:
    shown = dsn.redact(text, dsn_)
    assert hidden not in shown and dsn.HIDDEN in shown, shown


def test_a_password_is_hidden_where_it_stands_alone_not_inside_words() -> None:
    shown = dsn.redact("about ab: 'ab'", "postgresql://u:ab@h/d")
    assert shown == "about ***: '***'"
    shown = dsn.redact('postgresql://h/d failed for user "postgres"', "user=u password=postgres")
    assert shown == 'postgresql://h/d failed for user "***"'


def test_an_unparseable_dsn_is_refused_without_its_password() -> None:
    with pytest.raises(tenure.InvalidArgument) as given:
        dsn.resolve("postgresql://u:S3cretPW@[::1:5432/db")
    assert "S3cretPW" not in str(given.value) and "cannot be parsed" in str(given.value)
