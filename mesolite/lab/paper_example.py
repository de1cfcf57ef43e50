"""`mesolite experiment paper-example`: the DRF paper's worked example under its three
policies, as numbers and as the paper's bar chart (matplotlib, from the lab extra).

A cluster of <9 CPUs, 18 GB>; user A's tasks need <1 CPU, 4 GB>, user B's <3 CPUs,
1 GB>. The paper (sections 4 and 5) gives, in tasks:

- asset fairness: 6x = 7y on the CPU line, x = 63/25 = 2.52 and y = 54/25 = 2.16;
- CEEI: max x y on both lines, x = 45/11 (4.09) and y = 18/11 (1.64);
- DRF: 2x/9 = y/3 on the CPU line, x = 3 and y = 2.

Each is computed here by the references, not written down: `drf_reference.drf` and
`asset_fairness` exactly, `ceei.ceei` to its proven bound.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mesolite.lab.ceei import ceei
from mesolite.lab.drf_reference import asset_fairness, drf

CAPACITY = {"cpus": 9, "mem": 18}
DEMANDS = {"A": {"cpus": 1, "mem": 4}, "B": {"cpus": 3, "mem": 1}}
UNITS = {"cpus": "CPUs", "mem": "GB"}
_COLORS = {"A": "tab:blue", "B": "tab:orange"}


@dataclass(frozen=True, slots=True)
class Split:
    """One policy's allocation of the example: tasks per user, and what they hold."""

    policy: str
    tasks: Mapping[str, float]

    def held(self, user: str, resource: str) -> float:
        return self.tasks[user] * DEMANDS[user][resource]

    def share(self, user: str, resource: str) -> float:
        return self.held(user, resource) / CAPACITY[resource]


def splits() -> list[Split]:
    """Asset fairness, CEEI and DRF on the example, in the paper's order."""
    asset = asset_fairness(CAPACITY, DEMANDS).tasks
    market = ceei(CAPACITY, DEMANDS).tasks
    dominant = drf(CAPACITY, DEMANDS).tasks
    return [
        Split("Asset fairness", {u: float(x) for u, x in asset.items()}),
        Split("CEEI", dict(market)),
        Split("DRF", {u: float(x) for u, x in dominant.items()}),
    ]


def table(rows: list[Split]) -> str:
    lines = ["policy           user   tasks   CPUs    GB     CPU share   memory share"]
    for s in rows:
        for u in DEMANDS:
            lines.append(
                f"{s.policy:<16} {u:<5} {s.tasks[u]:6.2f} {s.held(u, 'cpus'):6.2f} "
                f"{s.held(u, 'mem'):6.2f}   {s.share(u, 'cpus'):8.1%}   {s.share(u, 'mem'):10.1%}"
            )
    return "\n".join(lines)


def plot(path: Path, rows: list[Split]) -> None:
    """The paper's figure: each policy's CPU and memory bars, split between A and B."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import PercentFormatter

    fig = Figure(figsize=(8, 4.2))
    ax = fig.subplots()
    width = 0.38
    for k, s in enumerate(rows):
        for offset, resource in ((-width / 2 - 0.02, "cpus"), (width / 2 + 0.02, "mem")):
            bottom = 0.0
            for u in DEMANDS:
                share = s.share(u, resource)
                ax.bar(
                    k + offset,
                    share,
                    width,
                    bottom=bottom,
                    color=_COLORS[u],
                    edgecolor="white",
                    label=f"user {u} {_demand(u)}" if k == 0 and resource == "cpus" else None,
                )
                if share > 0.06:
                    ax.text(
                        k + offset,
                        bottom + share / 2,
                        f"{s.held(u, resource):.3g} {UNITS[resource]}",
                        ha="center",
                        va="center",
                        fontsize=8,
                        color="white",
                    )
                bottom += share
            ax.text(
                k + offset, -0.03, "CPU" if resource == "cpus" else "memory", ha="center", va="top"
            )
    ax.set_xticks(
        range(len(rows)),
        [f"\n\n{s.policy}\nA {s.tasks['A']:.3g} tasks, B {s.tasks['B']:.3g}" for s in rows],
    )
    ax.tick_params(axis="x", length=0)
    ax.set_ylim(0, 1.05)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_ylabel("share of the cluster")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper center", ncol=2, fontsize=9, bbox_to_anchor=(0.5, 1.13), frameon=False)
    ax.set_title("The DRF paper's example, <9 CPUs, 18 GB>, under each policy", fontsize=10, pad=28)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _demand(user: str) -> str:
    d = DEMANDS[user]
    return f"<{d['cpus']} CPU{'s' if d['cpus'] > 1 else ''}, {d['mem']} GB>"


def run(out: Path) -> int:
    """`mesolite experiment paper-example`: print the allocations and draw the figure."""
    rows = splits()
    print(table(rows))
    out.parent.mkdir(parents=True, exist_ok=True)
    plot(out, rows)
    print(f"wrote {out}", file=sys.stderr)
    return 0
