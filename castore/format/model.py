"""attrs, imported here and nowhere else in castore: every record and value class is declared
with `attrs.define` / `attrs.frozen` / `attrs.field` through this module, so the dependency has
one owner (a third-party library is imported by exactly one module; tests/test_layers.py
checks it) and a change of it, or of how castore uses it, starts here."""

import attrs  # re-exported by __all__: mypy's attrs plugin still sees `attrs.define`

__all__ = ["attrs"]
