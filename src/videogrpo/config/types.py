"""Field types of the config dataclasses: coercion of YAML and `--config` strings, field docs, JSON Schema.

Generic over any dataclass, so the config module keeps only the sections and their rules.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import types
import typing
from typing import Any

from videogrpo.errors import ConfigError


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each dataclass field (torchtitan style), read from the source."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(getattr(nxt, "value", None), ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = nxt.value.value.strip()
    return docs


def class_doc(cls: type) -> str | None:
    """The docstring written on a dataclass itself (a section's), not the signature dataclasses fill in."""
    doc = ast.get_docstring(ast.parse(inspect.getsource(cls)).body[0])
    return " ".join(doc.split()) if doc else None


def hints_of(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def strip_optional(tp: Any) -> tuple[Any, bool]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def coerce(value: Any, tp: Any, where: str) -> Any:
    """Turn YAML values, and the strings `snakemake --config` produces, into the declared type."""
    inner, optional = strip_optional(tp)
    if value is None or (optional and isinstance(value, str) and value.strip().lower() in ("null", "none", "~")):
        if optional:
            return None
        raise ConfigError(f"{where}: null is not allowed; give a {getattr(inner, '__name__', inner)}")
    origin = typing.get_origin(inner)
    if origin is list:
        (item_tp,) = typing.get_args(inner)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, found {value!r}")
        if dataclasses.is_dataclass(item_tp):  # a list of records (refiners.experts): each built as a section is
            return [build(item_tp, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return [coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        key_tp, val_tp = typing.get_args(inner)
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, found {value!r}")
        return {coerce(k, key_tp, where): coerce(v, val_tp, f"{where}.{k}") for k, v in value.items()}
    if inner is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no"):
            return value.lower() in ("true", "yes")
        raise ConfigError(f"{where}: expected true or false, found {value!r}")
    if inner is int:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected an integer, found {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value.strip()):
            return int(value)
        raise ConfigError(f"{where}: expected an integer, found {value!r}")
    if inner is float:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected a number, found {value!r}")
        if isinstance(value, (int, float)):
            return float(value)
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected a number, found {value!r}") from None
    if inner is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{where}: expected a string, found {value!r}")
    raise ConfigError(f"{where}: unsupported field type {inner!r}")


def build(cls: type, data: Any, where: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, found {data!r}")
    hints = hints_of(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        prefix = f"{where}." if where else ""
        raise ConfigError(
            f"{', '.join(prefix + k for k in unknown)}: unknown field; valid fields of "
            f"{where or 'the config'}: {', '.join(sorted(known))}"
        )
    kwargs = {}
    for name, value in data.items():
        path = f"{where}.{name}" if where else name
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            kwargs[name] = build(tp, value, path)
        else:
            kwargs[name] = coerce(value, tp, path)
    return cls(**kwargs)


def to_plain(value: Any) -> Any:
    """A default as JSON holds it: records (dataclasses) as mappings."""
    if isinstance(value, list):
        return [to_plain(v) for v in value]
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def json_schema(root: type, choices: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    """JSON Schema of the config, generated from the dataclasses (defaults and descriptions included)."""

    def type_schema(tp: Any) -> dict[str, Any]:
        inner, optional = strip_optional(tp)
        origin = typing.get_origin(inner)
        if origin is list and dataclasses.is_dataclass(typing.get_args(inner)[0]):
            schema = {"type": "array", "items": section_schema(typing.get_args(inner)[0], "")}
        elif origin is list:
            schema = {"type": "array", "items": type_schema(typing.get_args(inner)[0])}
        elif origin is dict:
            schema = {"type": "object", "additionalProperties": type_schema(typing.get_args(inner)[1])}
        else:
            schema = {"type": {bool: "boolean", int: "integer", float: "number", str: "string"}[inner]}
        if optional:
            schema["type"] = [schema["type"], "null"]
        return schema

    def section_schema(cls: type, prefix: str) -> dict[str, Any]:
        docs = field_docs(cls)
        hints = hints_of(cls)
        defaults = cls()
        props = {}
        for f in dataclasses.fields(cls):
            path = f"{prefix}{f.name}"
            tp = hints[f.name]
            if dataclasses.is_dataclass(tp):
                props[f.name] = section_schema(tp, f"{path}.")
                continue
            prop = type_schema(tp)
            prop["default"] = to_plain(getattr(defaults, f.name))
            if f.name in docs:
                prop["description"] = docs[f.name]
            if path in choices:
                prop["enum"] = list(choices[path])
            props[f.name] = prop
        schema = {"type": "object", "additionalProperties": False, "properties": props, "default": {}}
        if prefix and (doc := class_doc(cls)):
            schema["description"] = doc
        return schema

    schema = section_schema(root, "")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "videogrpo workflow configuration (generated by `videogrpo schema`; do not edit)"
    return schema
