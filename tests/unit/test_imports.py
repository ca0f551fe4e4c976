"""Every module of the package imports (catches syntax errors and broken imports in rarely run code)."""

import importlib
import pkgutil

import rlft


def test_every_module_imports():
    names = [m.name for m in pkgutil.walk_packages(rlft.__path__, "rlft.")]
    assert len(names) > 15
    for name in names:
        importlib.import_module(name)
