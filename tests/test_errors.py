"""Error messages are one printable line, escaped by the same rule as the CLI and dashboard."""

from __future__ import annotations

from tenure.cli.tables import printable as shown_in_tables
from tenure.errors import InvalidArgument, printable


def test_an_error_message_escapes_bidi_controls_as_the_cli_does() -> None:
    key = "invoice\u202efdp.exe\x1b[2J\n"
    message = str(InvalidArgument(f"job key {key!s} is not allowed"))
    assert "\u202e" not in message and "\x1b" not in message and "\n" not in message
    assert "\\u202e" in message and "\\x1b" in message and "\\n" in message
    assert printable(key) == shown_in_tables(key) == "invoice\\u202efdp.exe\\x1b[2J\\n"
    assert printable("plain é ü") == "plain é ü"


def test_one_line_is_the_one_rule_for_messages_on_one_line() -> None:
    from tenure.cli.common import error_line
    from tenure.errors import one_line
    from tenure.exec import output

    assert one_line("server closed\n  the connection\tunexpectedly\r\n") == (
        "server closed the connection unexpectedly"
    )
    assert output.one_line is one_line
    assert error_line("a\nb") == "tenure: error: a b"
