"""TOML files a person wrote (the roles file, workload files): errors that name the file
and the line.

`read_toml(text, source, error)` parses, raising `error(source, line, "invalid TOML:
...")` for bad syntax. `tomllib` returns plain dicts without positions, so a semantic
error ("weight must be >= 0") is placed by scanning the text:
`KeyLines(text).find(("roles", "eng", "weight"))` is the line where that dotted key, or
its longest prefix, first appears. Each file's errors derive from `TomlFileError`,
whose message reads `SOURCE:LINE: problem`.

Pure: text in, data, line numbers or an error out.
"""

from __future__ import annotations

import math
import re
import tomllib
from typing import Any, TypeGuard

from mesolite.errors import MesoliteError

__all__ = ["KeyLines", "TomlFileError", "is_finite_number", "read_toml", "syntax_error_line"]

_TOML_POSITION = re.compile(r"\(at line (\d+), column \d+\)")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_BASIC_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_LITERAL_STRING = re.compile(r"'[^']*'")
_MULTILINE = ('"""', "'''")


class TomlFileError(MesoliteError, ValueError):
    """An invalid file; the message reads `SOURCE:LINE: problem` (`SOURCE: problem` when
    no line can be named)."""

    def __init__(self, source: str, line: int | None, problem: str) -> None:
        self.source = source
        self.line = line
        self.problem = problem
        where = source if line is None else f"{source}:{line}"
        super().__init__(f"{where}: {problem}")


def read_toml(text: str, source: str, error: type[TomlFileError]) -> dict[str, Any]:
    """The TOML in `text`; raises `error` naming `source` and the line if it is not TOML."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise error(source, syntax_error_line(e), f"invalid TOML: {e}") from None


def is_finite_number(value: object) -> TypeGuard[int | float]:
    """A finite int or float (bools are not numbers; a TOML int may be too big for a float)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def syntax_error_line(error: tomllib.TOMLDecodeError) -> int | None:
    """The line tomllib's message names, if it names one."""
    found = _TOML_POSITION.search(str(error))
    return int(found[1]) if found else None


class KeyLines:
    """The line where each dotted key (and each prefix of it) first appears.

    Table headers (`[roles."a/b"]`) set the current table and `key = value` lines add
    their dotted key to it. A key inside an inline table (`guarantee = { cpus = 8 }`) is
    found through its longest recorded prefix, which is on the same line. The lines
    inside a multi-line string (a shell script in `command = '''...'''`) are skipped, so
    `name=x` or `[ -e f ]` in a script is never taken for a key or a header. The worst a
    stranger layout can do is point at the table's header or give no line.
    """

    def __init__(self, text: str) -> None:
        self._first: dict[tuple[str, ...], int] = {}
        table: tuple[str, ...] = ()
        open_string: str | None = None  # the delimiter of the multi-line string we are in
        for number, raw in enumerate(text.splitlines(), start=1):
            if open_string is not None:
                if raw.count(open_string) % 2 == 1:
                    open_string = None
                continue
            line = raw.strip()
            if line.startswith("["):
                parsed = _dotted_key(line.lstrip("["))
                if parsed is not None and parsed[1].startswith("]"):
                    table = parsed[0]
                    self._record(table, number)
                continue
            parsed = _dotted_key(line)
            if parsed is not None and parsed[1].startswith("="):
                self._record(table + parsed[0], number)
                open_string = _opens_multiline(parsed[1])

    def _record(self, keys: tuple[str, ...], number: int) -> None:
        for end in range(1, len(keys) + 1):
            self._first.setdefault(keys[:end], number)

    def find(self, keys: tuple[str, ...]) -> int | None:
        for end in range(len(keys), 0, -1):
            number = self._first.get(keys[:end])
            if number is not None:
                return number
        return None


def _opens_multiline(value: str) -> str | None:
    """The delimiter of a multi-line string `value` (`= '''...`) leaves open, if any."""
    starts = [(value.find(d), d) for d in _MULTILINE if d in value]
    if not starts:
        return None
    _, delimiter = min(starts)
    return delimiter if value.count(delimiter) % 2 == 1 else None


def _dotted_key(text: str) -> tuple[tuple[str, ...], str] | None:
    """Split `a."b/c".d = 1` into (("a", "b/c", "d"), "= 1"); None if no key starts it."""
    keys: list[str] = []
    rest = text
    while True:
        rest = rest.lstrip()
        for pattern in (_BASIC_STRING, _LITERAL_STRING, _BARE_KEY):
            match = pattern.match(rest)
            if match is not None:
                break
        else:
            return None
        token = match[0]
        if pattern is _BARE_KEY:
            keys.append(token)
        elif pattern is _LITERAL_STRING:
            keys.append(token[1:-1])
        else:
            try:  # let tomllib undo the escapes
                keys.append(tomllib.loads(f"k = {token}")["k"])
            except tomllib.TOMLDecodeError:
                return None
        rest = rest[match.end() :].lstrip()
        if not rest.startswith("."):
            return tuple(keys), rest
        rest = rest[1:]
