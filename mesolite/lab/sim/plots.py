"""The simulator's figures (matplotlib, from the lab extra): utilization over time, job
completion times by job size, dominant shares over time; one curve or bar per policy."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mesolite.lab.sim.engine import SimResult
from mesolite.lab.sim.results import SIZE_BINS, bin_label, by_size

# Roles drawn one by one in the shares figure; the rest are summed as "others".
MAX_ROLES_DRAWN = 8


def plot_utilization(path: Path, results: Sequence[SimResult], title: str) -> None:
    """CPU and memory in use by tasks over time, one line per policy."""
    from matplotlib.figure import Figure

    names = sorted(results[0].samples[0].used) if results[0].samples else []
    fig = Figure(figsize=(8, 2.4 * max(1, len(names))))
    axes = fig.subplots(max(1, len(names)), 1, sharex=True, squeeze=False)[:, 0]
    for ax, name in zip(axes, names, strict=False):
        for r in results:
            ax.plot(
                [s.time for s in r.samples],
                [100 * s.used[name] for s in r.samples],
                label=r.policy,
                linewidth=1,
            )
        ax.set_ylabel(f"{name} in use (%)")
        ax.set_ylim(0, 105)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right")
    axes[0].set_title(title, fontsize=10)
    axes[-1].set_xlabel("time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_completion(path: Path, results: Sequence[SimResult], title: str) -> None:
    """Mean job completion time per job-size bin, bars per policy; with two or more
    policies, the first's reduction against the second above each bin."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4))
    ax = fig.subplots()
    labels = [bin_label(lo, hi) for lo, hi in SIZE_BINS]
    width = 0.8 / len(results)
    tables = [by_size(r) for r in results]
    for k, (r, table) in enumerate(zip(results, tables, strict=True)):
        xs = [i + (k - (len(results) - 1) / 2) * width for i in range(len(labels))]
        ax.bar(xs, [b.mean_completion or 0 for b in table], width, label=r.policy)
    if len(results) > 1:
        for i, (a, b) in enumerate(zip(tables[0], tables[1], strict=True)):
            if a.mean_completion and b.mean_completion:
                top = max(a.mean_completion, b.mean_completion)
                reduction = 1 - a.mean_completion / b.mean_completion
                ax.annotate(f"{reduction:+.0%}", (i, top), ha="center", va="bottom", fontsize=9)
    ax.set_xticks(
        range(len(labels)),
        [f"{lab}\n({t.jobs} jobs)" for lab, t in zip(labels, tables[0], strict=True)],
    )
    ax.set_xlabel("job size (tasks)")
    ax.set_ylabel("mean job completion time (s)")
    ax.legend()
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_shares(path: Path, results: Sequence[SimResult], title: str) -> None:
    """Each role's dominant share of what its tasks use over time, stacked, one panel per
    policy: the roles with the largest peak one by one, the rest as `others`; a thin
    line where a task was preempted."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 2.6 * len(results)))
    axes = fig.subplots(len(results), 1, sharex=True, squeeze=False)[:, 0]
    for ax, r in zip(axes, results, strict=True):
        times = sorted({s.time for s in r.samples})
        index = {t: i for i, t in enumerate(times)}
        series: dict[str, list[float]] = {}
        for t, role, share in r.shares:
            if t in index:
                series.setdefault(role, [0.0] * len(times))[index[t]] = share
        peaks = sorted(series, key=lambda role: -max(series[role]))
        drawn = sorted(peaks[:MAX_ROLES_DRAWN])
        others = [
            sum(series[role][i] for role in peaks[MAX_ROLES_DRAWN:]) for i in range(len(times))
        ]
        stacks = [series[role] for role in drawn]
        labels = list(drawn)
        if any(others):
            stacks.append(others)
            labels.append(f"{len(peaks) - MAX_ROLES_DRAWN} others")
        if stacks:
            ax.stackplot(times, *stacks, labels=labels, alpha=0.85)
        for t, _, _, _ in r.preemptions:
            ax.axvline(t, color="black", linewidth=0.5, alpha=0.3)
        ax.set_ylabel(f"{r.policy}\ndominant share")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=7, ncol=2)
    axes[0].set_title(title, fontsize=10)
    axes[-1].set_xlabel("time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_all(out: Path, results: Sequence[SimResult], title: str) -> list[Path]:
    paths = [out / "utilization.png", out / "completion.png", out / "shares.png"]
    plot_utilization(paths[0], results, title)
    plot_completion(paths[1], results, title)
    plot_shares(paths[2], results, title)
    return paths
