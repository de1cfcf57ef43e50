"""The roles configuration: the role tree with weights, guarantees and limits.

Roles form a tree by path: `eng` is the parent of `eng/ml` and `eng/web`. Each
role has

- a **weight** (default 1): its share of its parent's resources relative to its
  siblings. Weight 0 is allowed and, as in the Fair Scheduler, makes the role
  *fixed*: it gets its guarantee and nothing more. The weight may also be a
  table, one weight per resource (the DRF paper's weight vector):
  `weight = { cpus = 2, mem = 1 }`; resources it does not name weigh 1. The
  allocator then orders by the weighted dominant share max_r(share_r / w_r),
  and fair shares divide each resource by the weights for it.
- a **guarantee** per resource: the amount it is entitled to even when its
  weight alone would give it less.
- a **limit** per resource: the most it may hold. A resource the limit does not
  name is unlimited; a limit of 0 keeps the role off that resource entirely.

Amounts are absolute (`cpus = 8`) or a percentage of the cluster total
(`mem = "25%"`), resolved by `RolesConfig.resolve` whenever the total changes.
The file is TOML:

    [roles.eng]
    weight = 2.0
    guarantee = { cpus = 8, mem = "25%" }
    limit = { cpus = "50%" }

    [roles."eng/ml"]        # a path with "/" must be quoted
    limit = { gpus = 2 }
    weight = { gpus = 4 }   # 4 for GPUs, 1 for everything else

Preemption (master/preemptions.py) is set per role too: `min_share_timeout`
(seconds below its guarantee before it takes resources back; default 15 for a
role with a guarantee, `inf` for never), `fair_share_timeout` (seconds below
`fair_share_preemption_threshold` x its instantaneous fair share, default 0.5;
no fair-share preemption unless set).

A parent that is not declared (`eng` above, if it were missing) exists
implicitly with weight 1. The default role `*` always exists; the file may set
its weight, guarantee and limit but it cannot have children.

Checks made when loading, each reported with the file and line:

- weights (each one of a table too) finite and >= 0, with valid resource
  names; amounts finite, >= 0 and at most 1e15 (what
  `Resources` holds); percentages between 0 and 100; no unknown keys;
- a guarantee above the same role's limit, or above the limit of any of its
  ancestors (a child can never get more than its parent may hold).

Both checks compare like with like: an absolute guarantee against an absolute
limit, a percentage against a percentage. A mix (`cpus = 8` under
`cpus = "50%"`) can only be judged against a cluster size, so `resolve` cuts
such a guarantee down to the role's own limit instead of rejecting the file;
one above an ancestor's limit is left to the fair-share computation, which
scales guarantees that do not fit in the parent's share (`master.fair_share`).
Percentages resolve to whole thousandths, rounded down.

Role names are `*` or segments of `[A-Za-z0-9_.-]+` joined by `/`; the
segments `.` and `..` are refused.

Parsing is pure: `parse_roles` returns a new `RolesConfig` or raises
`RolesConfigError`, so a master reloading the file (on SIGHUP) keeps its old
configuration untouched when the new one is invalid.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from types import MappingProxyType
from typing import Any, NoReturn

from mesolite.master.errors import MasterError
from mesolite.model import DEFAULT_ROLE
from mesolite.resources import Resources
from mesolite.toml_files import KeyLines, TomlFileError, is_finite_number, read_toml

__all__ = [
    "DEFAULT_ROLE",
    "Amount",
    "Resolved",
    "RoleSpec",
    "RolesConfig",
    "RolesConfigError",
    "ancestor_roles",
    "is_valid_role",
    "load_roles",
    "parent_role",
    "parse_roles",
]

_SCALE = 1000  # Resources keep whole thousandths
_MAX_AMOUNT = 1e15  # the largest amount Resources accept
_SEGMENT = re.compile(r"[A-Za-z0-9_.-]+")
_RESOURCE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_PERCENT = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*%\s*")
_ROLE_KEYS = (
    "weight",
    "guarantee",
    "limit",
    "min_share_timeout",
    "fair_share_timeout",
    "fair_share_preemption_threshold",
)


class RolesConfigError(MasterError, TomlFileError):
    """An invalid roles file; the message reads `SOURCE:LINE: problem`."""


# Role paths --------------------------------------------------------------------


def is_valid_role(path: str) -> bool:
    """`*`, or segments of `[A-Za-z0-9_.-]+` joined by `/`.

    `.` and `..` are refused as segments: they read as relative paths, and the
    role tree uses `.` for a role's own frameworks.
    """
    if path == DEFAULT_ROLE:
        return True
    return all(_SEGMENT.fullmatch(s) and s not in (".", "..") for s in path.split("/"))


def parent_role(path: str) -> str | None:
    """`eng` for `eng/ml`; None for a top-level role."""
    parent, sep, _ = path.rpartition("/")
    return parent if sep else None


def ancestor_roles(path: str) -> tuple[str, ...]:
    """Nearest first, as Mesos' `roles::ancestors`: `a/b/c` gives (`a/b`, `a`)."""
    out: list[str] = []
    parent = parent_role(path)
    while parent is not None:
        out.append(parent)
        parent = parent_role(parent)
    return tuple(out)


# The configuration -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Amount:
    """An absolute amount, or (`percent=True`) a percentage of the cluster total."""

    value: float
    percent: bool = False

    def units(self, total_units: int) -> int:
        """This amount in thousandths, given the cluster total in thousandths.

        A percentage is rounded down, so guarantees adding up to 100% never
        promise more than the cluster holds and a limit never allows more than
        the percentage says.
        """
        if not self.percent:
            return round(self.value * _SCALE)
        return math.floor(_exact(self.value) * total_units / 100)

    def __str__(self) -> str:
        return f"{self.value:g}%" if self.percent else f"{self.value:g}"


def _exact(value: float) -> Fraction:
    # The decimal the file spelled ("33.3"), not the nearest binary float.
    return Fraction(repr(value))


def _empty() -> Mapping[str, Amount]:
    return MappingProxyType({})


def _no_weights() -> Mapping[str, float]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class RoleSpec:
    """One role as configured; an empty guarantee or limit means none.

    `resource_weights` holds a weight table's entries (the resources it names);
    every other resource weighs `weight`, which is 1 when the file gave a table.
    """

    path: str
    weight: float = 1.0
    guarantee: Mapping[str, Amount] = field(default_factory=_empty)
    limit: Mapping[str, Amount] = field(default_factory=_empty)
    resource_weights: Mapping[str, float] = field(default_factory=_no_weights)
    # Preemption (master/preemption.py, master/preemptions.py): how long the role may
    # stay below its guarantee (None: DEFAULT_MIN_SHARE_TIMEOUT; inf: never preempt
    # for it) or below `fair_share_preemption_threshold` x its instantaneous fair
    # share (None: never preempt for it) before it takes resources back.
    min_share_timeout: float | None = None
    fair_share_timeout: float | None = None
    fair_share_preemption_threshold: float = 0.5

    @property
    def effective_min_share_timeout(self) -> float | None:
        """How long the role waits below its guarantee before it preempts (None: never)."""
        timeout = (
            DEFAULT_MIN_SHARE_TIMEOUT if self.min_share_timeout is None else self.min_share_timeout
        )
        return None if math.isinf(timeout) else timeout


# A guaranteed role below its guarantee preempts after this long, unless its
# `min_share_timeout` says otherwise: guarantees are honoured without configuration.
DEFAULT_MIN_SHARE_TIMEOUT = 15.0
MAX_TIMEOUT = 365 * 24 * 3600.0

Resolved = tuple[Resources, dict[str, float] | None]


@dataclass(frozen=True, slots=True)
class RolesConfig:
    """Every configured role by path, including implicit parents and `*`."""

    roles: Mapping[str, RoleSpec]

    @classmethod
    def default(cls) -> RolesConfig:
        """No file: only the default role `*`, weight 1."""
        return cls(MappingProxyType({DEFAULT_ROLE: RoleSpec(DEFAULT_ROLE)}))

    def spec(self, path: str) -> RoleSpec:
        """The role's spec, or the default one (weight 1, no bounds) if not configured."""
        found = self.roles.get(path)
        return found if found is not None else RoleSpec(path)

    @staticmethod
    def parent(path: str) -> str | None:
        return parent_role(path)

    @staticmethod
    def ancestors(path: str) -> tuple[str, ...]:
        return ancestor_roles(path)

    def resolve(self, total: Resources) -> dict[str, Resolved]:
        """Each role's absolute (guarantee, limit) against the cluster `total`.

        The limit is a plain dict rather than `Resources`, because `Resources`
        drops zero amounts and a limit of 0 (no GPUs for this role) must not
        turn into "unlimited". It is None when the role has no limit at all;
        resources it does not name are unlimited. A guarantee is cut down to the
        role's own limit (see the module docstring on mixed kinds). A
        percentage of a resource missing from `total` is 0.
        """
        total_units = total._units
        out: dict[str, Resolved] = {}
        for path, spec in self.roles.items():
            caps = {n: a.units(total_units.get(n, 0)) for n, a in spec.limit.items()}
            promised: dict[str, int] = {}
            for name, amount in spec.guarantee.items():
                units = min(amount.units(total_units.get(name, 0)), caps.get(name, math.inf))
                if units:
                    promised[name] = int(units)
            limit = {n: u / _SCALE for n, u in caps.items()} if spec.limit else None
            out[path] = (Resources._from_units(promised), limit)
        return out


# Loading -----------------------------------------------------------------------


def load_roles(path: Path) -> RolesConfig:
    """Read and parse a roles file; any problem, unreadable file included, raises."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise RolesConfigError(str(path), None, f"cannot read the roles file: {e}") from None
    return parse_roles(text, source=str(path))


def parse_roles(text: str, source: str = "<roles>") -> RolesConfig:
    """Parse roles TOML; raises `RolesConfigError` naming `source` and the line."""
    return _Parser(text, source).parse(read_toml(text, source, RolesConfigError))


class _Parser:
    def __init__(self, text: str, source: str) -> None:
        self.source = source
        self.lines = KeyLines(text)

    def fail(self, keys: tuple[str, ...], problem: str) -> NoReturn:
        raise RolesConfigError(self.source, self.lines.find(keys), problem)

    def parse(self, data: dict[str, Any]) -> RolesConfig:
        for key in data:
            if key != "roles":
                self.fail((key,), f"unknown key {key!r} (expected [roles.NAME] tables)")
        table = data.get("roles", {})
        if not isinstance(table, dict):
            self.fail(("roles",), "'roles' must be a table of roles")
        specs: dict[str, RoleSpec] = {}
        for path, body in table.items():
            specs[path] = self.role(path, body)
        for path in list(specs):
            for ancestor in ancestor_roles(path):
                specs.setdefault(ancestor, RoleSpec(ancestor))
        specs.setdefault(DEFAULT_ROLE, RoleSpec(DEFAULT_ROLE))
        for spec in specs.values():
            self.check_under_ancestors(spec, specs)
        ordered = {path: specs[path] for path in sorted(specs)}
        return RolesConfig(MappingProxyType(ordered))

    def role(self, path: str, body: object) -> RoleSpec:
        where = ("roles", path)
        if path.startswith(DEFAULT_ROLE + "/"):
            self.fail(where, f"the default role {DEFAULT_ROLE!r} cannot have children")
        if not is_valid_role(path):
            self.fail(
                where,
                f"invalid role name {path!r}: expected '*' or segments of letters, digits,"
                " '_', '.', '-' joined by '/'",
            )
        if not isinstance(body, dict):
            self.fail(where, f"role {path!r} must be a table with {', '.join(_ROLE_KEYS)}")
        for key, value in body.items():
            if key not in _ROLE_KEYS:
                hint = ""
                if isinstance(value, dict):
                    hint = f' (for a child role write [roles."{path}/{key}"])'
                self.fail((*where, key), f"role {path!r}: unknown key {key!r}{hint}")
        weight, resource_weights = self.weight(path, body.get("weight", 1.0))
        guarantee = self.amounts(path, "guarantee", body.get("guarantee", {}))
        limit = self.amounts(path, "limit", body.get("limit", {}))
        for name, promised in guarantee.items():
            cap = limit.get(name)
            if cap is not None and _exceeds(promised, cap):
                self.fail(
                    (*where, "guarantee", name),
                    f"role {path!r}: guarantee {name} = {promised} is above its limit {cap}",
                )
        min_share = self.timeout(path, body, "min_share_timeout")
        fair_share = self.timeout(path, body, "fair_share_timeout")
        threshold = body.get("fair_share_preemption_threshold", 0.5)
        if not is_finite_number(threshold) or not 0 <= threshold <= 1:
            self.fail(
                (*where, "fair_share_preemption_threshold"),
                f"role {path!r}: fair_share_preemption_threshold must be a number from 0 to 1,"
                f" got {threshold!r}",
            )
        return RoleSpec(
            path,
            weight,
            guarantee,
            limit,
            resource_weights,
            min_share,
            fair_share,
            float(threshold),
        )

    def timeout(self, path: str, body: dict[str, Any], key: str) -> float | None:
        value = body.get(key)
        if value is None:
            return None
        inf = isinstance(value, float) and value == math.inf
        if not inf and (not is_finite_number(value) or not 0 <= value <= MAX_TIMEOUT):
            self.fail(
                ("roles", path, key),
                f"role {path!r}: {key} must be seconds from 0 to {MAX_TIMEOUT:g}, or inf"
                f" (never), got {value!r}",
            )
        return float(value)

    def weight(self, path: str, value: object) -> tuple[float, Mapping[str, float]]:
        """(the weight, the table's weights per resource): a number, or a table of them."""
        where = ("roles", path, "weight")
        if not isinstance(value, dict):
            if not is_finite_number(value) or value < 0:
                self.fail(
                    where,
                    f"role {path!r}: weight must be a finite number >= 0 (or a table of them"
                    f" per resource, like {{ cpus = 2 }}), got {value!r}",
                )
            return float(value), MappingProxyType({})
        weights: dict[str, float] = {}
        for name, w in value.items():
            at = (*where, name)
            if not _RESOURCE_NAME.fullmatch(name):
                self.fail(at, f"role {path!r}: invalid resource name {name!r} in weight")
            if not is_finite_number(w) or w < 0:
                self.fail(
                    at, f"role {path!r}: weight {name} must be a finite number >= 0, got {w!r}"
                )
            weights[name] = float(w)
        return 1.0, MappingProxyType(weights)

    def amounts(self, path: str, kind: str, table: object) -> Mapping[str, Amount]:
        where = ("roles", path, kind)
        if not isinstance(table, dict):
            self.fail(where, f"role {path!r}: {kind} must be a table like {{ cpus = 2 }}")
        out: dict[str, Amount] = {}
        for name, value in table.items():
            at = (*where, name)
            if not _RESOURCE_NAME.fullmatch(name):
                self.fail(at, f"role {path!r}: invalid resource name {name!r} in {kind}")
            if isinstance(value, str):
                match = _PERCENT.fullmatch(value)
                if match is None:
                    self.fail(at, f'role {path!r}: {kind} {name} = {value!r} is not "N%"')
                percent = float(match[1])
                if percent > 100:
                    self.fail(at, f"role {path!r}: {kind} {name} = {value!r} is above 100%")
                out[name] = Amount(percent, percent=True)
            elif isinstance(value, int | float) and not isinstance(value, bool):
                if not is_finite_number(value) or not 0 <= value <= _MAX_AMOUNT:
                    self.fail(
                        at,
                        f"role {path!r}: {kind} {name} = {value!r} must be a finite number"
                        f" between 0 and {_MAX_AMOUNT:g}",
                    )
                out[name] = Amount(float(value))
            else:
                self.fail(
                    at, f'role {path!r}: {kind} {name} must be a number or "N%", got {value!r}'
                )
        return MappingProxyType(out)

    def check_under_ancestors(self, spec: RoleSpec, specs: Mapping[str, RoleSpec]) -> None:
        for name, promised in spec.guarantee.items():
            for ancestor in ancestor_roles(spec.path):
                cap = specs[ancestor].limit.get(name)
                if cap is not None and _exceeds(promised, cap):
                    self.fail(
                        ("roles", spec.path, "guarantee", name),
                        f"role {spec.path!r}: guarantee {name} = {promised} is above the limit"
                        f" {cap} of {ancestor!r}",
                    )


def _exceeds(promised: Amount, cap: Amount) -> bool:
    """True when `promised` is above `cap` whatever the cluster size; mixed kinds never are."""
    if promised.percent != cap.percent:
        return False
    if promised.percent:
        return _exact(promised.value) > _exact(cap.value)
    return round(promised.value * _SCALE) > round(cap.value * _SCALE)
