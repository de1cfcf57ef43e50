"""Resources: a vector of named, non-negative scalar amounts.

Amounts are kept as whole thousandths (as Mesos keeps them with fixed-point
arithmetic), so adding and subtracting never drifts: an agent's allocated plus
free resources always equal its total exactly.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping

from mesolite.errors import MesoliteError
from mesolite.logs import clip

_SCALE = 1000
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*\Z")  # \Z: "$" lets a final newline in


class InvalidResources(MesoliteError, ValueError):
    """A resource name or amount that cannot be accepted."""


def _to_units(name: str, amount: float) -> int:
    if not isinstance(name, str) or not _NAME.match(name):
        shown = clip(name) if isinstance(name, str) else name
        raise InvalidResources(f"invalid resource name {shown!r}")
    if isinstance(amount, bool) or not isinstance(amount, int | float):
        raise InvalidResources(f"{name}: amount {amount!r} is not a number")
    if math.isnan(amount) or math.isinf(amount):
        raise InvalidResources(f"{name}: amount {amount} is not finite")
    if amount < 0:
        raise InvalidResources(f"{name}: amount {amount} is negative")
    if amount > 1e15:
        raise InvalidResources(f"{name}: amount {amount} is too large")
    return round(amount * _SCALE)


_new = object.__new__


class Resources(Mapping[str, float]):
    """An immutable mapping from resource name to amount, zero amounts omitted.

    ``Resources(cpus=0.5, mem=256)``, ``Resources({"cpus": 1, "gpus": 1})`` or
    ``Resources.parse("cpus:1;mem:256")``. Names are ``cpus``, ``mem`` (MB), ``disk``
    (MB), ``gpus`` or any other scalar an agent advertises; amounts are kept to a
    thousandth. ``a + b``, ``a - b`` (raises `InvalidResources` below zero),
    ``a.contains(b)``; a bad name or amount raises `InvalidResources`.
    """

    __slots__ = ("_units",)
    _units: dict[str, int]

    def __init__(self, amounts: Mapping[str, float] | None = None, **named: float) -> None:
        units: dict[str, int] = {}
        for source in (amounts or {}, named):
            for name, amount in source.items():
                u = _to_units(name, amount)
                if u:
                    units[name] = units.get(name, 0) + u
        self._units = units

    @classmethod
    def _from_units(cls, units: dict[str, int]) -> Resources:
        r = _new(cls)
        r._units = units
        return r

    @classmethod
    def parse(cls, text: str) -> Resources:
        """Parse Mesos' flag format, e.g. ``"cpus:4;mem:14336;gpus:1"``."""
        amounts: dict[str, float] = {}
        for part in text.split(";"):
            part = part.strip()
            if not part:
                continue
            name, sep, value = part.partition(":")
            name = name.strip()
            if not sep:
                raise InvalidResources(f"expected NAME:AMOUNT, got {part!r}")
            try:
                amount = float(value)
            except ValueError:
                raise InvalidResources(
                    f"{name}: amount {value.strip()!r} is not a number"
                ) from None
            if name in amounts:
                raise InvalidResources(f"resource {name!r} is given twice")
            amounts[name] = amount
        return cls(amounts)

    # Mapping protocol: amounts as floats.
    def __getitem__(self, name: str) -> float:
        return self._units[name] / _SCALE

    def __iter__(self) -> Iterator[str]:
        return iter(self._units)

    def __len__(self) -> int:
        return len(self._units)

    def get_amount(self, name: str) -> float:
        """The amount of `name`; 0 when absent (where ``self[name]`` raises KeyError)."""
        return self._units.get(name, 0) / _SCALE

    def is_empty(self) -> bool:
        """True when every amount is zero."""
        return not self._units

    def __add__(self, other: Resources) -> Resources:
        # On the allocator's hot path: a few million calls a second matter.
        units = self._units.copy()
        get = units.get
        for name, u in other._units.items():
            units[name] = get(name, 0) + u
        r = _new(Resources)
        r._units = units
        return r

    def __sub__(self, other: Resources) -> Resources:
        """Subtract; raises if any amount would go below zero."""
        units = dict(self._units)
        for name, u in other._units.items():
            left = units.get(name, 0) - u
            if left < 0:
                raise InvalidResources(
                    f"cannot subtract {other} from {self}: {name} would be negative"
                )
            if left:
                units[name] = left
            else:
                units.pop(name, None)
        return Resources._from_units(units)

    def contains(self, other: Resources) -> bool:
        """True when every amount in `other` is at most the amount here."""
        mine = self._units
        return all(mine.get(name, 0) >= u for name, u in other._units.items())

    def remainder(self, unit: Resources) -> Resources:
        """What is left here beside as many whole copies of `unit` as fit (all of it
        when `unit` is empty: copies of nothing take nothing). Exact, in thousandths."""
        mine, each = self._units, unit._units
        copies = min((mine.get(name, 0) // u for name, u in each.items()), default=0)
        units = {name: left for name, u in mine.items() if (left := u - copies * each.get(name, 0))}
        return Resources._from_units(units)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Resources):
            return self._units == other._units
        return NotImplemented

    def __hash__(self) -> int:
        return hash(frozenset(self._units.items()))

    def shares(self, total: Resources) -> dict[str, float]:
        """Each resource's fraction of `total` (resources absent from it are skipped)."""
        t = total._units
        return {name: u / t[name] for name, u in self._units.items() if t.get(name)}

    def to_dict(self) -> dict[str, float]:
        """A plain dict, names sorted."""
        return {name: u / _SCALE for name, u in sorted(self._units.items())}

    def __repr__(self) -> str:
        return f"Resources({self})"

    def __str__(self) -> str:
        if not self._units:
            return "{}"
        return ";".join(f"{n}:{u / _SCALE:g}" for n, u in sorted(self._units.items()))


EMPTY = Resources()
