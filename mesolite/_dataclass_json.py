"""JSON for frozen dataclasses, driven by their type hints: encode, decode with checks,
and the JSON Schema (draft 2020-12) of the same shape.

One description of a document (the dataclasses) gives all three, so the schema
cannot drift from what is written and read. The types a field may have:
`str`, `int`, `float`, `bool`, an `enum.Enum` of strings, `Resources` (an object
of non-negative amounts), `Mapping[str, X]`, `tuple[X, ...]`, `X | None`, and
another such dataclass. A field's `metadata=doc("...")` becomes its schema
description; a field with a default may be missing from a document (an
addition older writers do not make) and is not required by the schema.

Decoding ignores keys it does not know (a newer writer may add some) and
raises `DocumentError`, naming the place, for anything else that does not fit.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from mesolite.errors import MesoliteError
from mesolite.resources import InvalidResources, Resources

T = TypeVar("T")

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
_DOC = "doc"


class DocumentError(MesoliteError, ValueError):
    """A JSON document that does not have the shape its dataclass describes."""


def doc(text: str) -> dict[str, str]:
    """A field's description, for the schema: `x: int = field(metadata=doc("..."))`."""
    return {_DOC: text}


# Encoding ---------------------------------------------------------------------------


def encode(value: Any) -> Any:
    """The JSON value (dicts, lists, strings, numbers, booleans, None) of `value`."""
    if isinstance(value, Resources):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [encode(v) for v in value]
    if isinstance(value, Mapping):
        return {k: encode(v) for k, v in value.items()}
    return value


# Decoding ---------------------------------------------------------------------------


def decode(cls: type[T], data: Any) -> T:
    """`data` (parsed JSON) as an instance of the dataclass `cls`; raises `DocumentError`."""
    value: T = _decode(cls, data, "$")
    return value


def _decode(hint: Any, data: Any, where: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        [inner] = [a for a in args if a is not type(None)]
        return _decode(inner, data, where)
    if origin is tuple:
        return tuple(_decode(args[0], v, f"{where}[{i}]") for i, v in enumerate(_list(data, where)))
    if origin is Mapping:
        return {k: _decode(args[1], v, f"{where}.{k}") for k, v in _object(data, where).items()}
    if hint is Resources:
        amounts = {k: _number(v, f"{where}.{k}") for k, v in _object(data, where).items()}
        try:
            return Resources(amounts)
        except InvalidResources as e:
            raise DocumentError(f"{where}: {e}") from None
    if inspect.isclass(hint) and issubclass(hint, enum.Enum):
        try:
            return hint(data)
        except ValueError:
            raise DocumentError(f"{where}: {data!r} is not one of {_values(hint)}") from None
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _decode_dataclass(hint, data, where)
    if hint is float:
        return _number(data, where)
    if hint is bool and isinstance(data, bool):
        return data
    if hint is int and isinstance(data, int) and not isinstance(data, bool):
        return data
    if hint is str and isinstance(data, str):
        return data
    raise DocumentError(f"{where}: expected {_name(hint)}, got {_json_type(data)}")


def _decode_dataclass(cls: Any, data: Any, where: str) -> Any:
    data = _object(data, where)
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            values[f.name] = _decode(_hints(cls)[f.name], data[f.name], f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise DocumentError(f"{where}: {f.name!r} is missing")
    return cls(**values)


def _object(data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise DocumentError(f"{where}: expected an object, got {_json_type(data)}")
    return data


def _list(data: Any, where: str) -> list[Any]:
    if not isinstance(data, list):
        raise DocumentError(f"{where}: expected an array, got {_json_type(data)}")
    return data


def _number(data: Any, where: str) -> float:
    if isinstance(data, bool) or not isinstance(data, int | float):
        raise DocumentError(f"{where}: expected a number, got {_json_type(data)}")
    return float(data)


def _json_type(data: Any) -> str:
    names = {bool: "a boolean", str: "a string", dict: "an object", list: "an array"}
    if data is None:
        return "null"
    return names.get(type(data), "a number" if isinstance(data, int | float) else repr(data))


def _name(hint: Any) -> str:
    return {str: "a string", int: "an integer", bool: "a boolean"}.get(hint, str(hint))


def _values(cls: type[enum.Enum]) -> list[Any]:
    return [m.value for m in cls]


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


# Schema -----------------------------------------------------------------------------

_RESOURCES_SCHEMA = {
    "description": "Amounts by resource name, in each resource's unit (cpus: cores; "
    "mem, disk: MB); resources with nothing are left out.",
    "type": "object",
    "propertyNames": {"pattern": r"^[A-Za-z_][A-Za-z0-9_.\-]*$"},
    "additionalProperties": {"type": "number", "minimum": 0},
}


def json_schema(root: type, *, id: str, title: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of documents that `decode(root, ...)` reads."""
    defs: dict[str, Any] = {}
    ref = _schema(root, defs)
    return {"$schema": SCHEMA_DIALECT, "$id": id, "title": title, **ref, "$defs": defs}


def _schema(hint: Any, defs: dict[str, Any]) -> dict[str, Any]:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        [inner] = [a for a in args if a is not type(None)]
        return {"anyOf": [_schema(inner, defs), {"type": "null"}]}
    if origin is tuple:
        return {"type": "array", "items": _schema(args[0], defs)}
    if origin is Mapping:
        return {"type": "object", "additionalProperties": _schema(args[1], defs)}
    if hint is Resources:
        defs["Resources"] = _RESOURCES_SCHEMA
        return {"$ref": "#/$defs/Resources"}
    if inspect.isclass(hint) and issubclass(hint, enum.Enum):
        return {"enum": _values(hint)}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        name = hint.__name__
        if name not in defs:
            defs[name] = {}  # placed first: the definitions read in the order they are met
            defs[name] = _dataclass_schema(hint, defs)
        return {"$ref": f"#/$defs/{name}"}
    types_ = {str: "string", int: "integer", float: "number", bool: "boolean"}
    return {"type": types_[hint]}


def _dataclass_schema(cls: Any, defs: dict[str, Any]) -> dict[str, Any]:
    properties = {}
    for f in dataclasses.fields(cls):
        schema = _schema(_hints(cls)[f.name], defs)
        if _DOC in f.metadata:
            schema = {"description": f.metadata[_DOC], **schema}
        properties[f.name] = schema
    required = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    summary = inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].replace("\n", " ")
    return {
        "description": summary,
        "type": "object",
        "properties": properties,
        "required": required,
    }
