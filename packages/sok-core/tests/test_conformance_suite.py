"""The conformance suite's own layout: StorageConformance combines every concern, each once."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from sparse_operation_kit.testing import StorageConformance, conformance
from sparse_operation_kit.testing.conformance.base import ConformanceFixtures


def _concern_modules() -> list[ModuleType]:
    names = [info.name for info in pkgutil.iter_modules(conformance.__path__) if info.name != "base"]
    return [importlib.import_module(f"{conformance.__name__}.{name}") for name in names]


def _concerns() -> list[type]:
    """The abstract test classes the concern modules define (those their ``__all__`` names)."""
    return [
        obj
        for module in _concern_modules()
        for obj in (getattr(module, name) for name in module.__all__)
        if isinstance(obj, type) and issubclass(obj, ConformanceFixtures)
    ]


def test_every_concern_module_defines_one_concern() -> None:
    modules = _concern_modules()
    assert len(modules) >= 10
    for module in modules:
        classes = [obj for obj in _concerns() if obj.__module__ == module.__name__]
        assert len(classes) == 1, (module.__name__, classes)


def test_storage_conformance_combines_every_concern() -> None:
    missing = [c.__name__ for c in _concerns() if c not in StorageConformance.__mro__]
    assert missing == [], f"add {missing} to the bases of StorageConformance"


def test_no_test_is_defined_by_two_concerns() -> None:
    """A test name in two concerns would run only once under StorageConformance (one shadows the other)."""
    owners: dict[str, list[str]] = {}
    for concern in _concerns():
        for name in vars(concern):
            if name.startswith("test_"):
                owners.setdefault(name, []).append(concern.__name__)
    assert {name: where for name, where in owners.items() if len(where) > 1} == {}


def test_every_concern_is_documented() -> None:
    """The package docstring lists every concern and shows a backend subclassing some of them; each
    concern module says what it covers, and its class that it may be used alone."""
    for concern in _concerns():
        module = importlib.import_module(concern.__module__)
        assert f":class:`{concern.__name__}`" in conformance.__doc__, concern.__name__
        assert module.__doc__.startswith("The storage conformance suite, "), module.__name__
        assert "also usable alone" in " ".join(concern.__doc__.split()), concern.__name__
    assert "Example::" in conformance.__doc__
    assert "class TestMyBackendSoFar(LookupConformance, WriteConformance):" in conformance.__doc__
