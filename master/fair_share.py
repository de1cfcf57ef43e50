"""Hierarchical fair shares: how much of the cluster each role deserves.

Roles form a tree by path (`eng`, `eng/ml`, `eng/web`); the root is the whole
cluster. A node's fair share is divided among its children, one resource type
at a time, from the root down. Each child i has a weight w_i, a guarantee lo_i
(0 when it has none) and a limit hi_i (unlimited when it has none). Given the
parent's share T, find the ratio R with

    sum_i clamp(w_i * R, lo_i, hi_i) = min(T, sum_i hi_i)

and give child i `clamp(w_i * R, lo_i, hi_i)`: everyone gets the same amount
per unit of weight, except that nobody falls below their guarantee or rises
above their limit. This is the Hadoop Fair Scheduler's rule
(`ComputeFairShares`). With no guarantees or limits it is plain weighted
division: weights 1 and 3 over 8 cpus give 2 and 6.

**Weight vectors.** A role may weigh each resource differently (the DRF
paper's weight vector W_i = (w_i1, ..., w_im): `ShareInput.resource_weights`,
the resources it does not name weighing `weight`). Since the division is per
resource, w_i above is then simply the child's weight *for the resource being
divided*: cpus are divided by the children's cpus weights, memory by their mem
weights. So a child weighing { cpus = 2 } beside a sibling of weight 1 gets 2/3
of the CPUs and half of everything else. (The Fair Scheduler keeps a weight per
resource type in `ResourceWeights` the same way, though its configuration sets
one number for all.)

Special cases, the Fair Scheduler's "fixed" children (`getFairShareIfFixed`),
all follow from the same formula:

- a limit of 0 gives 0 (clamp to [0, 0]);
- weight 0 gives exactly the guarantee (clamp(0, lo, hi) = lo);
- a guarantee above the child's own limit counts as the limit.

**Steady and instantaneous shares.** The *steady* share (`active=None`) divides
among every role: what a role can count on when everyone is busy; it changes
only when the cluster or the configuration does. The *instantaneous* share
divides only among active roles: a role is active when it, or a role below it,
has a framework that wants offers. Inactive roles get 0 and their share goes
to their active siblings; a subtree without activity gets nothing. When every
role is active the two coincide.

**Exact, unlike the Fair Scheduler.** The Fair Scheduler finds R by a 25-step
binary search over doubles and truncates each share to an int, which can hand
out more than T, and overflows near 2^31. Here f(R) = sum_i clamp(w_i * R, ...)
is recognised as piecewise linear and non-decreasing, with breakpoints at
lo_i / w_i (where a child starts to grow) and hi_i / w_i (where it stops). The
breakpoints are sorted once, swept while f is tracked as level + slope * R,
and R is solved in closed form on the segment where f reaches the target:
O(n log n) per node and resource. Everything is in integers: amounts are whole
thousandths (as in `Resources`) and the weights of a group of siblings are
scaled to integers by their common power-of-two denominator (floats are
binary fractions), so R is an exact rational and values up to 1e15 are no
harder than small ones. The breakpoints are ordered by correctly rounded
floats, which can tie two distinct values but never invert them; the exact
result is checked, and in the rare case a tie hid the answer the sweep is
redone with exact `Fraction` keys.

**Rounding.** Exact shares are fractional; each child gets its share rounded
down to a thousandth, and the thousandths left over go one each to the
children with the largest remainders (ties: first by path), so the children's
shares add up to exactly min(T, sum of the limits) (with a weight 0 child
counting its guarantee as its limit). No child passes its limit, no child
falls below its guarantee when the guarantees fit, and raising one child's
weight never lowers its share (the exact share rises while the others fall
or stay, and largest-remainder rounding cannot undo that).

**Guarantees that do not fit.** When the children's guarantees add up to more
than T (a smaller cluster than the configuration expected, or a parent with a
small share), the Fair Scheduler gives everyone their guarantee anyway and
over-allocates. This module never hands out more than T: each child gets
lo_i * T / sum(lo), its guarantee scaled down in proportion, weights aside.
This is a choice: guarantees are promises made against a cluster size; when
they cannot all be kept they are all broken by the same fraction.

A role's share goes entirely to its children; frameworks registered directly
on an internal role should be represented by the caller as a child leaf (the
role tree's `.` group entry plays that part in the allocator).
"""

from __future__ import annotations

import heapq
import sys
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from operator import itemgetter, truediv

from mesolite.resources import EMPTY, Resources

__all__ = ["ROOT", "ShareInput", "compute_fair_shares", "role_tree"]

ROOT = ""  # the path of the tree's root: the whole cluster
_SCALE = 1000
_MAX_AMOUNT = 1e15
_MAX_WEIGHT = sys.float_info.max


@dataclass(frozen=True, slots=True)
class ShareInput:
    """One role's weight, absolute guarantee and limit.

    `limit` maps resource name to the most the role may hold; names it does not
    mention are unlimited, and None means no limit at all. It is a plain
    mapping because a limit of 0 is meaningful and `Resources` drops zeros.
    `RolesConfig.resolve` produces exactly these (guarantee, limit) pairs.
    `resource_weights` gives the resources it names a weight of their own
    (used when that resource is divided); the others weigh `weight`.
    """

    weight: float = 1.0
    guarantee: Resources = EMPTY
    limit: Mapping[str, float] | None = None
    resource_weights: Mapping[str, float] | None = None
    # Converted once here, not on every computation.
    _limit_units: dict[str, int] = field(init=False, repr=False, compare=False)
    _weight_parts: tuple[int, int] = field(init=False, repr=False, compare=False)
    _resource_parts: dict[str, tuple[int, int]] = field(init=False, repr=False, compare=False)
    _bounded: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_weight_parts", _weight_parts(self.weight, "weight"))
        object.__setattr__(
            self,
            "_resource_parts",
            {
                name: _weight_parts(w, f"weight for {name}")
                for name, w in (self.resource_weights or {}).items()
            },
        )
        units: dict[str, int] = {}
        for name, amount in (self.limit or {}).items():
            if isinstance(amount, bool) or not isinstance(amount, int | float):
                raise ValueError(f"limit {name}: {amount!r} is not a number")
            if not 0 <= amount <= _MAX_AMOUNT:  # also refuses NaN
                raise ValueError(f"limit {name}: {amount!r} is not between 0 and 1e15")
            units[name] = round(amount * _SCALE)
        object.__setattr__(self, "_limit_units", units)
        object.__setattr__(self, "_bounded", bool(units or self.guarantee._units))


def _weight_parts(w: object, what: str) -> tuple[int, int]:
    """A weight as (numerator, log2 of its power-of-two denominator): exact."""
    if isinstance(w, bool) or not isinstance(w, int | float) or not 0 <= w <= _MAX_WEIGHT:
        raise ValueError(f"{what} must be a finite number >= 0, got {w!r}")
    numerator, denominator = float(w).as_integer_ratio()  # denominator: a power of 2
    return numerator, denominator.bit_length() - 1


_DEFAULT = ShareInput()


def role_tree(paths: Iterable[str]) -> dict[str, list[str]]:
    """The children of every role that has some, sorted by path.

    `ROOT` holds the top-level roles; ancestors missing from `paths` are added
    (`a/b/c` brings `a` and `a/b`). Roles without children have no entry.
    """
    return _tree(paths)[1]


def _tree(paths: Iterable[str]) -> tuple[list[str], dict[str, list[str]]]:
    """(every role in path order, the children of each role that has some)."""
    ordered = list(paths)
    nodes = set(ordered)
    if ROOT in nodes:
        raise ValueError("the empty path is the root, not a role")
    if len(nodes) != len(ordered):
        ordered = list(nodes)
    nested = [path for path in ordered if "/" in path]
    for path in nested:
        parent = path.rpartition("/")[0]
        while parent and parent not in nodes:
            nodes.add(parent)
            ordered.append(parent)
            parent = parent.rpartition("/")[0]
    ordered.sort()  # nearly linear when the paths come sorted, as RolesConfig keeps them
    if not nested:
        return ordered, {ROOT: ordered}
    children: dict[str, list[str]] = {ROOT: []}
    for node in ordered:
        parent = node.rpartition("/")[0]
        siblings = children.get(parent)
        if siblings is None:
            children[parent] = [node]
        else:
            siblings.append(node)
    return ordered, children


def compute_fair_shares(
    roles: Mapping[str, ShareInput],
    total: Resources,
    active: Collection[str] | None = None,
) -> dict[str, Resources]:
    """Every role's fair share of `total` (see the module docstring).

    `roles` holds every role taking part, by path; missing ancestors join with
    the defaults (weight 1, no guarantee or limit). `active=None` computes
    steady shares; a collection of paths (normally the leaf roles with a
    framework that wants offers) computes instantaneous shares. Returns a share
    for every role in the tree, implicit ancestors included, in path order.
    Cost: O(n log n) per resource over the whole tree.
    """
    ordered, tree = _tree(roles)
    result = dict.fromkeys(ordered, EMPTY)
    live = None if active is None else _live_roles(active, result)
    pending: list[tuple[str, dict[str, int]]] = [(ROOT, total._units)]
    while pending:
        node, share = pending.pop()
        kids = tree[node]
        if live is not None:
            kids = [kid for kid in kids if kid in live]
        if not kids or not share:
            continue
        inputs = [roles.get(kid, _DEFAULT) for kid in kids]
        names = list(share)
        splits = _split_node([share[name] for name in names], names, inputs)
        shares: list[dict[str, int]] = [{} for _ in kids]
        for name, split in zip(names, splits, strict=True):
            for units, part in zip(shares, split, strict=True):
                if part:
                    units[name] = part
        result.update(zip(kids, map(Resources._from_units, shares), strict=True))
        if len(tree) > 1:  # some role has children
            pending.extend(
                (kid, units)
                for kid, units in zip(kids, shares, strict=True)
                if units and kid in tree
            )
    return result


def _live_roles(active: Collection[str], known: Mapping[str, object]) -> set[str]:
    """The active roles and all their ancestors."""
    live: set[str] = set()
    for path in active:
        if path not in known:
            raise ValueError(f"active role {path!r} is not among the roles")
        node = path
        while node and node not in live:
            live.add(node)
            node = node.rpartition("/")[0]
    return live


def _split_node(amounts: list[int], names: list[str], inputs: list[ShareInput]) -> list[list[int]]:
    """Divide each resource's `amount` among the children described by `inputs`."""
    weights, zero_weights = _scaled_weights([i._weight_parts for i in inputs])
    # Children with a weight vector: their weight depends on the resource divided.
    vectors = any(i._resource_parts for i in inputs)
    bounded = [index for index, i in enumerate(inputs) if i._bounded]
    guarantees = [inputs[index].guarantee._units for index in bounded]
    limits = [inputs[index]._limit_units for index in bounded]
    splits = []
    for name, amount in zip(names, amounts, strict=True):
        if vectors:
            weights, zero_weights = _scaled_weights(
                [i._resource_parts.get(name, i._weight_parts) for i in inputs]
            )
        # Guarantees and limits, sparse: child index -> thousandths. Resources
        # hold no zeros, so a guarantee found is positive; a limit may be 0.
        lo = {
            index: g for index, gs in zip(bounded, guarantees, strict=True) if (g := gs.get(name))
        }
        hi = {
            index: h
            for index, hs in zip(bounded, limits, strict=True)
            if (h := hs.get(name)) is not None
        }
        if lo or hi:
            splits.append(_divide(amount, weights, lo, hi, zero_weights))
        else:
            splits.append(_proportional(amount, weights))
    return splits


def _scaled_weights(parts: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """The weights times their common power-of-two denominator (exact ints), and which are 0."""
    shift = max([exponent for _, exponent in parts])
    weights = [numerator << (shift - exponent) for numerator, exponent in parts]
    zero_weights = [index for index, w in enumerate(weights) if not w] if 0 in weights else []
    return weights, zero_weights


# Dividing one resource among siblings ----------------------------------------------
#
# Amounts are ints (thousandths) and weights ints (scaled). Guarantees `lo` and
# limits `hi` are sparse: child index -> amount, absent meaning 0 and unlimited.
# Each function returns the children's shares in order.


def _divide(
    total: int, weights: list[int], lo: dict[int, int], hi: dict[int, int], zero_weights: list[int]
) -> list[int]:
    """Split `total`: sum of clamp(w*R, lo, hi) = min(total, sum of hi)."""
    n = len(weights)
    if hi and lo:  # a guarantee above the limit counts as the limit
        lo = {i: min(g, hi.get(i, g)) for i, g in lo.items()}
    promised = sum(lo.values())
    if promised >= total:
        # Guarantees do not fit (or fit exactly): scale them all by total/promised.
        shares = [0] * n
        if promised:
            for i, part in zip(lo, _proportional(total, list(lo.values())), strict=True):
                shares[i] = part
        return shares
    # Everyone reaches their limit (a weight 0 child's limit is its guarantee)?
    capped = sum(1 for i in hi if weights[i]) if zero_weights else len(hi)
    if capped == n - len(zero_weights):
        cap = sum(h for i, h in hi.items() if weights[i]) + sum(lo.get(i, 0) for i in zero_weights)
        if cap <= total:
            shares = [0] * n
            for i, h in hi.items():
                shares[i] = h
            for i in zero_weights:
                shares[i] = lo.get(i, 0)
            return shares
    # Otherwise the shares add up to exactly `total` at some ratio R.
    split = _split_at_ratio(total, weights, lo, hi, exact_sort=False)
    if split is None:
        split = _split_at_ratio(total, weights, lo, hi, exact_sort=True)
        assert split is not None, "the exact sweep always finds the ratio"
    return split


def _split_at_ratio(
    target: int, weights: list[int], lo: dict[int, int], hi: dict[int, int], exact_sort: bool
) -> list[int] | None:
    """Find R and split; None if float ordering hid the answer (retry with exact_sort).

    Preconditions: sum(lo) < target < sum(hi) (hi of a weight 0 child: its lo),
    and every guarantee at most its limit.
    """
    # f(R) = level + slope * R between breakpoints. Below every breakpoint a
    # child with a guarantee sits at it (level); one without grows (slope).
    key = _exact_ratio if exact_sort else truediv
    level = sum(lo.values())
    slope = sum(weights)
    rising = [(g, w) for i, g in lo.items() if g and (w := weights[i])]
    slope -= sum([w for _, w in rising])
    events = [(key(g, w), g, w, False) for g, w in rising]
    events += [(key(h, w), h, w, True) for i, h in hi.items() if (w := weights[i])]
    events.sort(key=itemgetter(0))
    for _, amount, w, at_limit in events:
        # f at this breakpoint, R = amount / w, compared with target, times w.
        if level * w + slope * amount >= target * w:
            break
        if at_limit:
            level += amount
            slope -= w
        else:
            level -= amount
            slope += w
    if slope <= 0:
        return None
    # R = (target - level) / slope. Every child's exact share is w * R, as
    # quotient and remainder over `slope`, then clamped to its bounds.
    num = target - level
    den = slope
    base, rems = _scaled(weights, num, den)
    for i, g in lo.items():
        if base[i] < g:
            base[i] = g
            rems[i] = 0
    for i, h in hi.items():
        if base[i] >= h:
            base[i] = h
            rems[i] = 0
    short = target - sum(base)
    if short * den != sum(rems):
        return None  # the clamped shares do not add up to target: R was wrong
    _hand_out(base, rems, short)
    return base


def _exact_ratio(a: int, b: int) -> Fraction:
    return Fraction(a, b)


def _scaled(weights: list[int], num: int, den: int) -> tuple[list[int], list[int]]:
    """Each w * num / den as (quotients, remainders)."""
    first = weights[0]
    n = len(weights)
    if weights.count(first) == n:
        q, r = divmod(first * num, den)
        return [q] * n, [r] * n
    distinct = set(weights)
    if len(distinct) * 4 <= n:  # few distinct weights: divide once per weight
        qs = {w: w * num // den for w in distinct}
        rs = {w: w * num % den for w in distinct}
        return [qs[w] for w in weights], [rs[w] for w in weights]
    return [w * num // den for w in weights], [w * num % den for w in weights]


def _proportional(total: int, weights: list[int]) -> list[int]:
    """Split `total` in proportion to `weights` (all >= 0), exactly, in whole units."""
    n = len(weights)
    if weights.count(weights[0]) == n:  # equal weights; the common case
        if not weights[0]:
            return [0] * n
        q, short = divmod(total, n)
        return [q + 1] * short + [q] * (n - short)
    wsum = sum(weights)
    if not wsum:
        return [0] * n
    base, rems = _scaled(weights, total, wsum)
    _hand_out(base, rems, total - sum(base))
    return base


def _hand_out(base: list[int], rems: list[int], short: int) -> None:
    """Give one unit each to the `short` largest remainders; ties to the lower index.

    Each remainder is below the common denominator and they add up to `short`
    denominators, so at least `short` of them are positive: a child at its
    limit (remainder 0) never gets one.
    """
    if short <= 0:
        return
    n = len(rems)
    if short * 16 < n:
        chosen = heapq.nlargest(short, range(n), key=rems.__getitem__)
    else:  # sorted() keeps equal remainders in index order, reverse=True included
        chosen = sorted(range(n), key=rems.__getitem__, reverse=True)[:short]
    for i in chosen:
        base[i] += 1
