"""The pages' HTML from their templates (castore/ui/templates): the only importer of Jinja2.

Every value is escaped (autoescape): a task id, a key, a receipt or a reason is text a
caller chose, and must never become markup on the page of the person on call.
"""

from __future__ import annotations

from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from castore.ui.reading import age_text

_ENV = Environment(
    loader=PackageLoader("castore.ui", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    undefined=StrictUndefined,  # a name the template expects and the page forgot fails loudly
    trim_blocks=False,
)
_ENV.filters["age"] = age_text


def render(name: str, **context: Any) -> str:
    """Template `name` filled with `context`."""
    return _ENV.get_template(name).render(**context)
