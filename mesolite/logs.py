"""Logging set-up for entry points. Libraries only call `structlog.get_logger(__name__)`.

Clients control much of what is logged (ids, names, hostnames, the reasons a call was
rejected, which quote the bad value back). `clip` shortens one such string; the
processors set up here also clip every value of every log line to `LOGGED_VALUE_LIMIT`
characters, so no client can make one line long (a 3 MB id is logged as its first and
last characters and its length).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import structlog

CLIPPED_DEFAULT = 64
LOGGED_VALUE_LIMIT = 1000
_NOT_CLIPPED = frozenset({"exc_info", "stack", "exception"})


def clip(value: str, limit: int = CLIPPED_DEFAULT) -> str:
    """`value` if at most `limit` characters; else its head and tail around what was cut.

    For client-controlled strings in logs and in error messages that quote them back:
    `clip("x" * 3_000_000)` is 60-odd characters that still say how long it was.
    """
    if len(value) <= limit:
        return value
    keep = max(limit - 40, 2)
    head, tail = keep - keep // 4, keep // 4
    return f"{value[:head]}…({len(value)} characters)…{value[-tail:]}"


def clip_values(
    logger: object, method: str, event_dict: structlog.types.EventDict
) -> structlog.types.EventDict:
    """A structlog processor: every value of the line (the message too) clipped to
    `LOGGED_VALUE_LIMIT` characters; containers are clipped as their repr."""
    for key, value in event_dict.items():
        if key in _NOT_CLIPPED:
            continue
        if isinstance(value, str):
            if len(value) > LOGGED_VALUE_LIMIT:
                event_dict[key] = clip(value, LOGGED_VALUE_LIMIT)
        elif isinstance(value, list | tuple | set | frozenset | dict | bytes):
            text = repr(value)
            if len(text) > LOGGED_VALUE_LIMIT:
                event_dict[key] = clip(text, LOGGED_VALUE_LIMIT)
    return event_dict


def configure(json: bool = False, level: str = "info") -> None:
    """Key-value lines on a terminal, one JSON object per line with `json=True`."""
    renderer: structlog.types.Processor
    if json:
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    structlog.configure(
        processors=_processors(renderer),
        wrapper_class=_filtering(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def configure_to_files(
    directory: Path,
    routes: Mapping[str, str],
    default: str = "other.log",
    json: bool = False,
    level: str = "info",
) -> list[Path]:
    """Send every log line to files in `directory`, none to the terminal (for `mesolite
    demo`, whose terminal shows a live table).

    `routes` maps logger names (`structlog.get_logger(__name__)`: a module or a package
    above it) to file names, the longest match winning: ``{"mesolite.master": "master.log"}``
    sends `master.server` and `master.master` there. Anything else goes to `default`, as
    do the standard library's `logging` (asyncio, grpc, aiohttp) and warnings. Returns
    the files, each created (empty) even if nothing is logged to it.
    """
    directory.mkdir(parents=True, exist_ok=True)
    files = _LogFiles(directory, routes, default)
    renderer: structlog.types.Processor
    if json:
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=_processors(renderer),
        wrapper_class=_filtering(level),
        logger_factory=files,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(files.open(default))
    handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.getLevelNamesMapping()[level.upper()])
    logging.captureWarnings(True)
    return files.paths


class _LogFiles:
    """A structlog logger factory: loggers of one route share one line-buffered file."""

    def __init__(self, directory: Path, routes: Mapping[str, str], default: str) -> None:
        self._directory = directory
        self._routes = dict(routes)
        self._default = default
        self._files: dict[str, TextIO] = {}
        for name in (*self._routes.values(), default):
            self.open(name)

    @property
    def paths(self) -> list[Path]:
        return [self._directory / name for name in self._files]

    def open(self, name: str) -> TextIO:
        if name not in self._files:
            # Open for the life of the process, as sys.stderr would be.
            self._files[name] = (self._directory / name).open("a", buffering=1)
        return self._files[name]

    def file_for(self, logger_name: str) -> str:
        parts = logger_name.split(".")
        for i in range(len(parts), 0, -1):
            name = self._routes.get(".".join(parts[:i]))
            if name is not None:
                return name
        return self._default

    def __call__(self, *args: Any) -> structlog.WriteLogger:
        logger_name = args[0] if args and isinstance(args[0], str) else ""
        return structlog.WriteLogger(self.open(self.file_for(logger_name)))


def _processors(renderer: structlog.types.Processor) -> list[structlog.types.Processor]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        clip_values,
        renderer,
    ]


def _filtering(level: str) -> type[structlog.types.BindableLogger]:
    return structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()])
