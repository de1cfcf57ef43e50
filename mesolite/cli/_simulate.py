"""`mesolite simulate run FILE | facebook`: the trace-driven simulator (`mesolite/lab/sim/`)
on the real master core and allocator, in virtual time; CSV files and figures out."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from mesolite import logs

POLICY_CHOICES = ("drf", "asset", "slots")


def add_parser(sub: Any) -> None:
    """Register `mesolite simulate` (on an argparse subparsers object)."""
    s = sub.add_parser(
        "simulate",
        help="replay a workload on the real master core and allocator, in virtual time",
    )
    ss = s.add_subparsers(dest="simulation", required=True)
    r = ss.add_parser("run", help="the cluster and jobs of a workload file (TOML)")
    r.add_argument("workload", type=Path, metavar="FILE")
    _common(r, default_policies=["drf"])
    f = ss.add_parser(
        "facebook",
        help="a Facebook-2010-like workload as the DRF paper simulates it (parameters below)",
    )
    from mesolite.lab.sim.facebook import FacebookParams

    for field in fields(FacebookParams):
        default = field.default
        f.add_argument(
            "--" + field.name.replace("_", "-"),
            type=type(default),
            default=default,
            dest=field.name,
            help=f"(default {default})",
        )
    f.add_argument("--save", type=Path, metavar="FILE", help="also write the workload here")
    _common(f, default_policies=["drf", "slots"])


def _common(p: argparse.ArgumentParser, default_policies: list[str]) -> None:
    p.add_argument(
        "--policy",
        nargs="+",
        choices=POLICY_CHOICES,
        default=default_policies,
        help=f"the policies to run, each in turn; the first is compared with the others "
        f"(default {' '.join(default_policies)})",
    )
    p.add_argument("--out", type=Path, default=Path("sim-out"), metavar="DIR")
    p.add_argument(
        "--allocator-seed", type=int, default=0, help="the allocator's seed (agent order)"
    )
    p.add_argument(
        "--check-invariants",
        action="store_true",
        help="check the master's bookkeeping after every step (slow)",
    )
    p.add_argument("--no-figures", action="store_true", help="CSV files and the table only")
    switches = {
        "demand": "whether jobs declare what they wait for (Call.Demand): as the workload "
        "says (default), on, off, or both ways (labelled POLICY-demand)",
        "packing": "the master's --packing (best-fit placement of what jobs declared; needs "
        "demand): as the workload says (default), on, off, or both ways (labelled "
        "POLICY-packing)",
        "reservations": "with packing, reserve agents for task shapes that fit nowhere yet: "
        "as the workload says (default: on), on, off, or both ways (labelled "
        "POLICY-reserving)",
        "preemption": "the master's preemption: as the workload says (default), on, off, or "
        "each policy run both ways (labelled POLICY and POLICY-no-preemption)",
    }
    for name, help_text in switches.items():
        p.add_argument(
            f"--{name}", choices=("file", "on", "off", "both"), default="file", help=help_text
        )


def run_simulate(args: argparse.Namespace) -> int:
    logs.configure(level="warning")
    from mesolite.lab.sim.engine import WorkloadCannotRun, simulate
    from mesolite.lab.sim.facebook import FacebookParams, facebook_workload
    from mesolite.lab.sim.results import summary_table, write_csvs
    from mesolite.lab.sim.workload import SimWorkloadError, dump_workload, load_workload

    if args.simulation == "run":
        try:
            workload = load_workload(args.workload)
        except (SimWorkloadError, OSError) as e:
            print(f"mesolite simulate: {e}", file=sys.stderr)
            return 2
        title = f"{args.workload.name}"
    else:
        params = FacebookParams(**{f.name: getattr(args, f.name) for f in fields(FacebookParams)})
        workload = facebook_workload(params)
        if args.save:
            args.save.write_text(dump_workload(workload))
            print(f"workload written to {args.save}")
        title = (
            f"Facebook-like: {params.jobs} jobs on {params.agents} agents of "
            f"<{params.agent_resources}>, seed {params.seed}"
        )

    def ways(choice: str, from_file: bool) -> list[bool]:
        return {"file": [from_file], "on": [True], "off": [False], "both": [True, False]}[choice]

    runs = [
        (p, pre, dem, pack, res)
        for p in args.policy
        for pre in ways(args.preemption, workload.settings.preemption)
        for dem in ways(args.demand, workload.settings.demand)
        for pack in ways(args.packing, workload.settings.packing)
        for res in ways(args.reservations, workload.settings.reservations)
    ]
    results = []
    for policy, preemption, demand, packing, reservations in runs:
        run_on = dataclasses.replace(
            workload,
            settings=dataclasses.replace(
                workload.settings,
                preemption=preemption,
                demand=demand,
                packing=packing,
                reservations=reservations,
            ),
        )
        try:
            result = simulate(
                run_on, policy, seed=args.allocator_seed, check_invariants=args.check_invariants
            )
        except WorkloadCannotRun as e:
            print(f"mesolite simulate: {e}", file=sys.stderr)
            return 2
        if args.preemption == "both" and not preemption:
            result.policy += "-no-preemption"
        if args.demand == "both" and demand:
            result.policy += "-demand"
        if args.packing == "both" and packing:
            result.policy += "-packing"
        if args.reservations == "both" and reservations:
            result.policy += "-reserving"
        results.append(result)
        write_csvs(result, args.out)
        if result.invariant_violations:
            print(
                f"{policy}: invariant violated: {result.invariant_violations[0]}", file=sys.stderr
            )
            return 1
    last_arrival = max(j.arrival for j in workload.jobs)
    print(summary_table(results, until=last_arrival or None))
    print(f"(mean use over 0-{last_arrival:.0f} s, while jobs arrive)")
    if not args.no_figures:
        try:
            from mesolite.lab.sim.plots import plot_all
        except ImportError as e:
            print(f"figures need {e.name}: pip install 'mesolite[lab]'", file=sys.stderr)
            return 2
        plot_all(args.out, results, title)
    print(f"CSV files{'' if args.no_figures else ' and figures'} in {args.out}/")
    return 0
