"""Reading config YAML safely, and mapping its values onto the typed config sections.

:func:`load_yaml` is ``yaml.safe_load`` with three refusals, for config files and ``--set`` values alike:

* **Duplicate keys.** YAML parsers keep the last of two equal keys in a mapping (``env: {id: A, id: B}`` is
  ``B``; a section written twice loses the first one). Here any repeated key is a :class:`ConfigError` naming
  the key's dotted path and both lines (keys are compared as written, after YAML's type resolution, so
  ``a`` and ``"a"`` are the same key). Merge keys (``<<: *defaults``) are not duplicates: what they merge may
  be overridden, as YAML intends.
* **Alias bombs.** Anchors and aliases (``&a`` / ``*a``) may be used, but a document may expand to at most
  :data:`MAX_NODES` nodes, counting an aliased node in full at every use (so the few hundred bytes of a
  "billion laughs" file that expand to 10^9 strings are refused), and may not contain itself (a recursive alias).
  The count runs on the composed node graph, each node visited once, before any value is built: refusal costs
  time linear in the file's size.
* **Deep nesting.** A document may nest at most :data:`MAX_DEPTH` levels.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import numbers
import re
import typing
from typing import Any, Dict, List

import yaml

from .errors import ConfigError, first_line, short_repr

#: most YAML nodes (mappings, sequences, scalars, keys included) a config document may expand to
MAX_NODES = 10_000
#: deepest nesting of mappings/sequences in a config document
MAX_DEPTH = 32

_MERGE = "tag:yaml.org,2002:merge"


def load_yaml(stream, source: str, lines: bool = True) -> Any:
    """``yaml.safe_load(stream)`` refusing duplicate keys and alias bombs with a :class:`ConfigError` that starts
    with ``source`` (e.g. ``"config file c.yaml"``); ``lines``: name the lines of duplicate keys. YAML syntax
    errors propagate as ``yaml.YAMLError`` for the caller to report."""
    loader = _ConfigLoader(stream)
    loader.source, loader.name_lines = source, lines
    try:
        return loader.get_single_data()
    except RecursionError:
        raise ConfigError(f"{source}: nested deeper than {MAX_DEPTH} levels") from None
    except ConfigError:
        raise
    except ValueError as exc:  # a scalar YAML resolves but Python cannot build (a 5000-digit int, 2026-13-01)
        raise ConfigError(f"{source}: {first_line(exc)}") from None
    finally:
        loader.dispose()


def yaml_problem(exc: "yaml.YAMLError") -> str:
    """A YAML syntax error in one line: what is wrong and where (``found character '\\t' that cannot start any token
    at line 4, column 1``); PyYAML's first line names only its context (``while scanning for the next token``)."""
    problem, mark = getattr(exc, "problem", None), getattr(exc, "problem_mark", None)
    if not problem:
        return first_line(exc)
    return problem + (f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "")


class _ConfigLoader(yaml.SafeLoader):
    source = "config"
    name_lines = True

    def compose_document(self):
        node = super().compose_document()
        _Walk(self.source, self.name_lines).size(node, "", 0)
        return node


class _ConfigDumper(yaml.SafeDumper):
    """safe_dump's dumper, quoting the strings :func:`load_yaml` reads as numbers (below): a string ``'1e5'`` in
    ``env.kwargs`` was written unquoted to config.yaml and read back as 100000.0 (``--resume`` then refused the run
    as edited, ``evaluate`` gave the env a float)."""


def dump_yaml(data) -> str:
    """``data`` as YAML text that :func:`load_yaml` reads back as the same values (keys in their order)."""
    return yaml.dump(data, Dumper=_ConfigDumper, sort_keys=False)


# YAML 1.2's floats that YAML 1.1 (PyYAML) reads as strings: 1e-3, 1e5, 1.0e5 (no dot, or no exponent sign);
# env.kwargs reach the env as read, so `--set env.kwargs.g=1e1` gave the env the string '1e1' ("1e1" quoted stays one)
for _cls in (_ConfigLoader, _ConfigDumper):
    _cls.add_implicit_resolver("tag:yaml.org,2002:float",
                               re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
                               list("-+0123456789."))


class _Walk:
    """Expanded size of a node graph (memoised per node), with the duplicate-key and recursion checks."""

    def __init__(self, source: str, name_lines: bool):
        self.source, self.name_lines = source, name_lines
        self.sizes: Dict[int, int] = {}
        self.open: set = set()

    def fail(self, path: str, msg: str):
        raise ConfigError(f"{self.source}: {path + ': ' if path else ''}{msg}")

    def size(self, node, path: str, depth: int) -> int:
        key = id(node)
        if key in self.sizes:
            return self.sizes[key]
        if key in self.open:
            self.fail(path, "a YAML alias refers to a node that contains it (recursive alias); refused")
        if depth > MAX_DEPTH:
            self.fail(path, f"nested deeper than {MAX_DEPTH} levels")
        self.open.add(key)
        total = 1
        if isinstance(node, yaml.MappingNode):
            seen: Dict[tuple, int] = {}
            for k, v in node.value:
                child = path
                if isinstance(k, yaml.ScalarNode) and k.tag != _MERGE:
                    child = f"{path}.{k.value[:40]}" if path else k.value[:40]
                    line = k.start_mark.line + 1
                    if (k.tag, k.value) in seen:
                        where = f" (lines {seen[(k.tag, k.value)]} and {line})" if self.name_lines else ""
                        self.fail("", f"duplicate key {short_repr(child)}{where}; each key may appear once")
                    seen[(k.tag, k.value)] = line
                total += self.size(k, child, depth + 1) + self.size(v, child, depth + 1)
                self._bound(total, path)
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                total += self.size(v, f"{path}[{i}]", depth + 1)
                self._bound(total, path)
        self.open.discard(key)
        self.sizes[key] = total
        return total

    def _bound(self, total: int, path: str) -> None:
        if total > MAX_NODES:
            self.fail(path, f"expands to more than {MAX_NODES} YAML nodes (an aliased node counts at every use, "
                            "as in a 'billion laughs' file); refused")


# ---------------------------------------------------------------------- YAML values -> typed fields
def unknown_key(where: str, key: str, known) -> str:
    """Message for an unknown key, with the closest known one as a hint."""
    names = list(known)
    hint = difflib.get_close_matches(str(key), names, n=1)
    suffix = f" (did you mean '{hint[0]}'?)" if hint else f" (known: {', '.join(names)})"
    return f"{where}: unknown key {short_repr(key)}{suffix}"


class KeysOnly:
    """A config section (a dataclass) whose attributes are its keys: setting another name (``cfg.ppo.nsteps = 8``,
    a typo) is a one-line ConfigError, as that key in a file is, not an attribute nothing reads."""
    SECTION = "config"  # (its name in a file)

    def __setattr__(self, name: str, value: Any) -> None:
        fields = getattr(type(self), "__dataclass_fields__", {})
        if name not in fields:
            raise ConfigError(unknown_key(self.SECTION, name, fields))
        object.__setattr__(self, name, value)


def set_field(section_obj, section: str, key: str, value: Any) -> None:
    """``section_obj.key = value`` converted to the field's declared type (ConfigError naming ``section.key``)."""
    fields = {f.name: f for f in dataclasses.fields(section_obj)}
    if key not in fields:
        raise ConfigError(unknown_key(section, key, fields))
    hints = typing.get_type_hints(type(section_obj))
    setattr(section_obj, key, coerce(f"{section}.{key}", hints[key], value))



def _number_text(value):
    """YAML 1.1 reads ``1e-3`` and ``1e5`` (no dot) as strings: such a string becomes its float; anything else is
    returned unchanged."""
    if isinstance(value, str) and len(value) < 100:
        try:
            return float(value)
        except ValueError:
            pass
    return value

#: the largest finite float32: float settings must not exceed it (the graphs compute in float32)
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38  # numpy.finfo(numpy.float32).tiny: the smallest normal float32


def check_positive(key: str, value, null: bool = False) -> None:
    """ConfigError unless ``value`` > 0 (or None with ``null``) and at least the smallest normal float32: the
    graphs compute in float32, where 1e-50 is 0 (adam_eps 1e-50 made every update non-finite, a learning rate of
    1e-50 trained nothing)."""
    if (null and value is None) or (value is not None and value >= FLOAT32_TINY):
        return
    detail = (f" (at least {FLOAT32_TINY:.4g}, the smallest normal float32: the graphs compute in float32)"
              if value is not None and 0 < value < FLOAT32_TINY else "")
    raise ConfigError(f"{key}: must be > 0{' or null' if null else ''}{detail}, got {short_repr(value)}")


#: the strings a key of a Union type takes besides its number (by the key's name), for its error message
STRING_FORMS = {"batch_size": "'auto'", "ent_coef": "'auto'/'auto_<initial value>'", "target_entropy": "'auto'",
                "host_acting": "'auto'", "memory_limit": "a size like '16GB'",
                "worker_memory_limit": "a size like '2GB'"}


def coerce(name: str, tp, value: Any) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    got = short_repr(value)
    if origin is typing.Union:  # Optional[X] or Union[int, str]
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return coerce(name, options[0], value)
        refusals = []
        for option in options:
            try:
                return coerce(name, option, value)
            except ConfigError as exc:
                refusals.append((option, exc))
        for option, exc in refusals:  # a number of the option's own kind: its reason (1e39: beyond float32)
            if (option is float and isinstance(value, numbers.Real) and not isinstance(value, bool)) or \
                    (option is int and isinstance(value, numbers.Integral) and not isinstance(value, bool)):
                raise exc
        names = {int: "an integer", float: "a number", bool: "true/false",
                 str: STRING_FORMS.get(name.rsplit(".", 1)[-1], "a string")}
        raise ConfigError(f"{name}: expected {' or '.join(names.get(o, str(o)) for o in options)}, got {got}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{name}: expected true/false, got {got}")
    if tp is int:
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):  # numpy integers too
            if abs(int(value)) >= 2**63:  # every integer setting is a count, size or seed that MindSpore holds in int64
                raise ConfigError(f"{name}: expected a 64-bit integer, got {got}")
            return int(value)
        value = _number_text(value)
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
            return int(value)  # 1e5 written as a float
        if isinstance(value, float) and value.is_integer():
            if abs(value) >= 2**63:
                raise ConfigError(f"{name}: expected a 64-bit integer, got {got}")
            raise ConfigError(f"{name}: {got} is a float beyond 2**53, where floats skip integers; write the integer "
                              "in digits")
        raise ConfigError(f"{name}: expected an integer, got {got}")
    if tp is float:
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            if not math.isfinite(float(value)):
                raise ConfigError(f"{name}: expected a finite number, got {got}")
            value = float(value)
        else:
            value = _number_text(value)
            if not (isinstance(value, float) and math.isfinite(value)):
                raise ConfigError(f"{name}: expected a number, got {got}")
        if abs(value) > FLOAT32_MAX:  # (the graphs compute in float32: 1e39 would be inf there)
            raise ConfigError(f"{name}: expected a number finite in float32 (|x| <= 3.4e38), got {got}")
        return value
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{name}: expected a string, got {got}")
    if origin in (list, List):
        if not isinstance(value, list):
            raise ConfigError(f"{name}: expected a list, got {got}")
        return [coerce(f"{name}[{i}]", args[0], v) for i, v in enumerate(value)]
    if origin in (dict, Dict):
        if not isinstance(value, dict):
            raise ConfigError(f"{name}: expected a mapping, got {got}")
        return copy.deepcopy(value)
    raise TypeError(f"unsupported config field type {tp} for {name}")  # programming error
