"""What every module of the command line shares: how a command stops with an ``error:`` line."""

from __future__ import annotations

import sys

import click


def fail(message: str, code: int = 2) -> None:
    """Print ``error: <message>`` on stderr and exit with ``code`` (2: bad input, 1: a check
    that found problems)."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)
