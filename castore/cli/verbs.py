"""The verb modules the parser registers, in the order `castore --help` shows them."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from castore.cli import (
    brief,
    create,
    decide,
    demo,
    doctor,
    ending,
    inspect,
    maintenance,
    overview,
    ui,
    upgrade,
    watch,
)

Registrar = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]

REGISTRARS: list[Registrar] = [
    create.register,
    overview.register,
    brief.register,
    inspect.register,
    decide.register,
    ending.register,
    maintenance.register,
    upgrade.register,
    watch.register,
    ui.register,
    doctor.register,
    demo.register,
]
