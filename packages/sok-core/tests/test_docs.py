"""The documentation site covers the public API, and the README's links lead somewhere.

``mkdocs build --strict`` (ci/test.sh) fails on a broken link or an API directive that names
nothing; these tests catch what it cannot: a public name that no API page renders (datasette's
meta-tests of its hooks are the model), and a link of the README, which is not part of the site.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"
#: Names of ``sparse_operation_kit.__all__`` that are values, not objects an API directive renders;
#: the page documents them in its text as ``sok.<name>``.
SOK_VALUES = ("__version__", "tf_version")


def _directives(page: str) -> set[str]:
    """The object paths of the ``::: path`` directives of ``docs/api/<page>``."""
    text = (DOCS / "api" / page).read_text(encoding="utf-8")
    return set(re.findall(r"^::: ([\w.]+)\s*$", text, flags=re.MULTILINE))


def _undocumented(names: list[str], directives: set[str]) -> list[str]:
    rendered = {path.rsplit(".", 1)[-1] for path in directives} | directives
    return sorted(name for name in names if name not in rendered)


def test_every_public_name_of_sok_has_an_api_entry():
    import sparse_operation_kit as sok

    page = (DOCS / "api" / "sok.md").read_text(encoding="utf-8")
    values = [name for name in sok.__all__ if name in SOK_VALUES]
    missing = _undocumented([name for name in sok.__all__ if name not in SOK_VALUES], _directives("sok.md"))
    missing += [name for name in values if f"`sok.{name}`" not in page]
    assert not missing, f"docs/api/sok.md does not document {missing} of sparse_operation_kit.__all__; add a ::: line"


@pytest.mark.parametrize(
    ("module", "page"), [("sparse_operation_kit.plugins", "plugins.md"), ("sparse_operation_kit.testing", "testing.md")]
)
def test_every_public_name_of_a_package_has_an_api_entry(module, page):
    import importlib

    names = importlib.import_module(module).__all__
    missing = _undocumented(list(names), _directives(page))
    assert not missing, f"docs/api/{page} does not document {missing} of {module}.__all__; add a ::: line"


def test_readme_links_lead_to_files():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [t for t in targets if "://" not in t]
    assert local, "the README links into docs/"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"
