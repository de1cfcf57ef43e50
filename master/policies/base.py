"""The one interface every share policy implements."""

from __future__ import annotations

from typing import Protocol

from mesolite.resources import Resources


class SharePolicy(Protocol):
    name: str

    def share(self, allocation: Resources, total: Resources) -> float:
        """How much of `total` the `allocation` counts as: 0 for nothing, 1 for everything."""
        ...
