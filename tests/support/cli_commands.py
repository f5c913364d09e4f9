"""Every leaf command of the `tenure` group, with the arguments it needs to get past its
own parsing, so tests can run each one without listing them by hand."""

from __future__ import annotations

import click

#: Arguments a command needs besides options with defaults (exec's command after `--`).
NEEDS: dict[str, list[str]] = {
    "release": ["--key", "k"],
    "result put": ["--key", "k", "--token", "1"],
    "result get": ["--key", "k"],
    "exec": ["--key", "k", "--", "true"],
    "relay": ["--webhook", "t=http://127.0.0.1:1/"],
    "outbox retry": ["--all"],
    "worker": ["secret_app:app"],
    "jobs pause": ["k"],
    "jobs resume": ["k"],
    "jobs trigger": ["k"],
    "jobs remove": ["k"],
    "jobs history": ["k"],
    "schedules add": ["k", "--task", "t", "--every", "1h"],
    "schedules update": ["k", "--args", "{}"],
    "schedules remove": ["k"],
    "schedules pause": ["k"],
    "schedules resume": ["k"],
    "schedules show": ["k"],
    "schedules backfill": ["k", "--from", "2020-01-01T00:00Z", "--to", "2020-01-02T00:00Z"],
}


def leaf_commands() -> list[tuple[list[str], click.Command]]:
    """``(path, command)`` for every command that runs something (groups excluded)."""
    from tenure.cli.main import cli

    found: list[tuple[list[str], click.Command]] = []

    def walk(command: click.Command, path: list[str]) -> None:
        if isinstance(command, click.Group):
            for name, sub in sorted(command.commands.items()):
                walk(sub, [*path, name])
        else:
            found.append((path, command))

    walk(cli, [])
    return found


def with_options(path: list[str], *options: str) -> list[str]:
    """The command line ``path NEEDS options`` with ``options`` before exec's ``--``."""
    needs = NEEDS.get(" ".join(path), [])
    split = needs.index("--") if "--" in needs else len(needs)
    return [*path, *needs[:split], *options, *needs[split:]]
