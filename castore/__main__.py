"""`python -m castore`: the same as the `castore` command."""

from castore.cli import entry_point

entry_point()
