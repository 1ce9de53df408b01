"""A griffe extension (mkdocs.yml) that renders the reStructuredText markup of our docstrings.

The docstrings follow pytest's and pluggy's style: Google sections (``Args:``) with RST roles
(``:class:`~sparse_operation_kit.storage.Storage```) and literal blocks introduced by ``::``.
Markdown knows neither, so before a docstring is parsed a role becomes a code span of its target
(the last component for ``~`` targets, as Sphinx shows it) and ``Example::`` becomes ``Example``
(its indented block already renders as code).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|meth|func|mod|data|attr|exc|obj):`(~?)([^`]+)`")
LITERAL_INTRO = re.compile(r"::[ \t]*$", re.MULTILINE)


def _role(match: re.Match) -> str:
    short, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


def _literal_intro(match: re.Match, text: str) -> str:
    line_start = text.rfind("\n", 0, match.start()) + 1
    before = text[line_start : match.start()].strip()
    # A line that is only "Example::" would become a Google "Example:" section; keep it a title.
    return "" if before in ("Example", "Examples") else ":"


def rst_to_markdown(text: str) -> str:
    """The docstring ``text`` with RST roles and ``::`` literal-block introductions made Markdown."""
    text = ROLE.sub(_role, text)
    return LITERAL_INTRO.sub(lambda m: _literal_intro(m, text), text)


class RstMarkup(griffe.Extension):
    """Rewrites each object's docstring with :func:`rst_to_markdown` when griffe loads it."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rst_to_markdown(obj.docstring.value)
