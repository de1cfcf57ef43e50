"""The experiment's figures (matplotlib, from the lab extra): each run's shares over
time and the comparison of the policies, with the equilibria drawn as levels."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from mesolite.lab.experiment_model import (
    JOBS,
    ExperimentConfig,
    Sample,
    best_packing,
    dominant_share,
    equilibrium,
    times,
)
from mesolite.lab.experiment_report import fmt_resources

if TYPE_CHECKING:
    from matplotlib.axes import Axes


_COLORS = {"job1": "tab:blue", "job2": "tab:orange"}


def plot_run(path: Path, config: ExperimentConfig, samples: Sequence[Sample]) -> None:
    """The paper's figure: CPU, memory and dominant share of both jobs over time."""
    from matplotlib.figure import Figure

    # A bare Figure (no pyplot): no global state, so drawing in a worker thread is safe.
    fig = Figure(figsize=(8, 8))
    axes = fig.subplots(3, 1, sharex=True)
    panels = (("cpu_share", "CPU share"), ("mem_share", "memory share"))
    for ax, (attr, label) in zip(
        axes, (*panels, ("dominant_share", "dominant share")), strict=True
    ):
        _draw_shares(ax, config, samples, attr, label)
    _draw_levels(axes[2], config, _equilibrium_levels(config, config.policy), "dashed")
    _draw_levels(axes[2], config, _packing_levels(config), "dotted")
    axes[0].legend(loc="upper right")
    axes[0].set_title(
        f"Dynamic sharing under {config.policy}: {config.agents} agents of "
        f"{fmt_resources(config.agent_resources)}\n(dashed: the {config.policy} equilibrium; "
        "dotted: the best whole-task packing)",
        fontsize=10,
    )
    axes[2].set_xlabel("time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_comparison(
    path: Path, config: ExperimentConfig, runs: Mapping[str, Sequence[Sample]]
) -> None:
    """Dominant shares of both jobs under each policy, one panel per policy."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 2.6 * len(runs)))
    axes = fig.subplots(len(runs), 1, sharex=True, squeeze=False)[:, 0]
    drf_levels = _equilibrium_levels(config, "drf")
    for ax, (policy, samples) in zip(axes, runs.items(), strict=True):
        _draw_shares(ax, config, samples, "dominant_share", f"{policy}\ndominant share")
        _draw_levels(ax, config, drf_levels, "dashed")
        if policy != "drf":
            _draw_levels(ax, config, _equilibrium_levels(config, policy), "dotted")
    axes[0].legend(loc="upper right")
    axes[0].set_title(
        "Dominant shares under each policy\n(dashed: the DRF equilibrium; "
        "dotted: the policy's own equilibrium)",
        fontsize=10,
    )
    axes[-1].set_xlabel("time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _draw_shares(
    ax: Axes, config: ExperimentConfig, samples: Sequence[Sample], attr: str, label: str
) -> None:
    from matplotlib.ticker import PercentFormatter

    for job in JOBS:
        points = [s for s in samples if s.job == job]
        ax.plot(
            [s.time_s for s in points],
            [getattr(s, attr) for s in points],
            color=_COLORS[job],
            label=job,
            linewidth=1.4,
        )
    for p in range(1, len(config.phases)):
        ax.axvline(p * config.phase_seconds, color="grey", linestyle=":", linewidth=1)
    ax.set_ylabel(label)
    ax.set_ylim(0, 1)
    ax.set_xlim(0, config.duration)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.grid(alpha=0.3)


def _draw_levels(
    ax: Axes,
    config: ExperimentConfig,
    levels: Sequence[dict[str, float]],
    style: Literal["dashed", "dotted"],
) -> None:
    """One horizontal segment per phase and job at `levels[phase][job]`."""
    for p, level in enumerate(levels):
        start = p * config.phase_seconds
        for job in JOBS:
            ax.hlines(
                level[job],
                start,
                start + config.phase_seconds,
                colors=_COLORS[job],
                linestyles=style,
                linewidth=0.9,
            )


def _equilibrium_levels(config: ExperimentConfig, policy: str) -> list[dict[str, float]]:
    """The policy's equilibrium dominant share of each job, phase by phase."""
    levels = []
    for demands in config.phases:
        eq = equilibrium(policy, config.cluster, demands)
        levels.append({job: float(eq.dominant_shares[job]) for job in JOBS})
    return levels


def _packing_levels(config: ExperimentConfig) -> list[dict[str, float]]:
    """The dominant shares of the best whole-task packing, phase by phase."""
    levels = []
    for demands in config.phases:
        packed = best_packing(config.policy, config.agent_resources, config.agents, demands)
        levels.append(
            {
                job: dominant_share(times(d, n), config.cluster)
                for job, d, n in zip(JOBS, demands, packed, strict=True)
            }
        )
    return levels


# -- entry point ------------------------------------------------------------------------------
