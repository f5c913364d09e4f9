"""The ``tenure`` command line: one module per command group, shared options in
:mod:`.common`, the group itself in :mod:`.main`."""

from .main import cli, main

__all__ = ["cli", "main"]
