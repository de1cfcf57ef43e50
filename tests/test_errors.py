"""One error root: every exception class mesolite defines derives from `MesoliteError`."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import mesolite
from mesolite import framework_sdk
from mesolite.errors import MesoliteError

pytestmark = pytest.mark.unit


def defined_exceptions() -> list[type[BaseException]]:
    found = []
    for info in pkgutil.walk_packages(mesolite.__path__, "mesolite."):
        if info.name.startswith("mesolite.v1"):
            continue  # generated code
        module = importlib.import_module(info.name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__ == info.name:
                found.append(value)
    return found


def test_every_error_derives_from_the_one_root() -> None:
    errors = defined_exceptions()
    assert len(errors) >= 10  # the walk found them
    strays = [
        f"{e.__module__}.{e.__qualname__}" for e in errors if not issubclass(e, MesoliteError)
    ]
    assert strays == []


def test_the_sdk_root_is_the_project_root() -> None:
    assert framework_sdk.MesoliteError is MesoliteError
    assert issubclass(framework_sdk.InvalidCall, ValueError)
