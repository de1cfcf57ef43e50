"""`mesolite experiment dynamic-sharing`: the references it prints, and a short real run."""

from __future__ import annotations

import csv
import shutil
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

from mesolite.cli import build_parser
from mesolite.framework_sdk import Offer, Resources, TaskSpec
from mesolite.lab.experiment import comparison, run_and_write
from mesolite.lab.experiment_model import (
    CSV_FIELDS,
    JOBS,
    PAPER_PHASES,
    ExperimentConfig,
    best_packing,
    equilibrium,
)
from mesolite.lab.phased_job import PhasedJob

# The paper's cluster: 48 nodes of 4 CPUs and 14 GB.
CAPACITY = {"cpus": 48 * 4, "mem": 48 * 14336}


def test_phase1_equilibrium_is_drf_reference_on_the_paper_cluster() -> None:
    config = ExperimentConfig()
    assert dict(config.cluster) == CAPACITY
    eq = equilibrium("drf", config.cluster, PAPER_PHASES[0])
    # Worked by hand. Dominant resources: job1 memory (10240 / 688128 = 1/67.2 a
    # task), job2 CPUs (1/192 a task). Equal dominant shares s give job1 67.2 s
    # tasks and job2 192 s; CPUs run out first (67.2 s + 192 s = 192 at
    # s = 20/27, while memory would allow s = 7/9), so job1 runs 448/9 tasks,
    # job2 1280/9, and both hold 20/27 (74%) of their dominant resource.
    assert eq.tasks == {"job1": Fraction(448, 9), "job2": Fraction(1280, 9)}
    assert eq.dominant_shares == {"job1": Fraction(20, 27), "job2": Fraction(20, 27)}
    assert eq.saturated == {"cpus"}
    # Asset fairness: a job1 task is worth 1/192 + 10240/688128 = 27/1344 of the
    # cluster, a job2 task 1/192 + 1024/688128 = 9/1344; equal worth means job2
    # runs 3 tasks per job1 task, and CPUs run out at 48 and 144 (memory would
    # allow 51.7 and 155).
    asset = equilibrium("asset", config.cluster, PAPER_PHASES[0])
    assert asset.tasks == {"job1": 48, "job2": 144}
    assert asset.shares == {"job1": Fraction(48 * 27, 1344), "job2": Fraction(144 * 9, 1344)}
    assert asset.saturated == {"cpus"}


def test_slot_equilibrium_equalises_slots() -> None:
    # Slots of <1 CPU, 2 GB>: a job1 task of phase 1 is 5 slots, a job2 task 1 slot.
    eq = equilibrium("slots", ExperimentConfig().cluster, PAPER_PHASES[0])
    assert eq.tasks == {"job1": 32, "job2": 160}  # 160 slots each; the CPUs run out


def test_best_packing_of_phase1_is_what_the_paper_measured() -> None:
    # At most one 10 GB task fits on a 14 GB node: job1 gets 48 tasks (71% of the memory)
    # and job2 the 144 CPUs left (75%), the paper's "about 70%" and "about 75%".
    config = ExperimentConfig()
    packed = best_packing("drf", config.agent_resources, config.agents, PAPER_PHASES[0])
    assert packed == (48, 144)


async def test_a_short_run_writes_the_csv_figure_and_table(tmp_path: Path) -> None:
    config = ExperimentConfig(
        agents=4,
        phase_seconds=2.0,
        task_seconds=(0.3, 0.8),
        sample_interval=0.25,
        progress_every=0,
    )
    lines: list[str] = []
    written = await run_and_write(config, tmp_path, out=lines.append)

    with written.csv.open(newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == CSV_FIELDS
        rows = list(reader)
    phases = [int(r["phase"]) for r in rows]
    assert phases == sorted(phases)
    assert set(phases) == {1, 2, 3}
    assert {r["job"] for r in rows} == set(JOBS)
    times = [float(r["time_s"]) for r in rows]
    assert times == sorted(times)
    for r in rows:
        for field in ("cpu_share", "mem_share", "dominant_share"):
            assert 0.0 <= float(r[field]) <= 1.0
        assert float(r["dominant_share"]) == max(float(r["cpu_share"]), float(r["mem_share"]))
        assert float(r["allocated_share"]) >= float(r["dominant_share"])  # plus offers
    assert any(int(r["tasks"]) > 0 for r in rows)

    assert written.figure.read_bytes().startswith(b"\x89PNG")
    table = written.table.read_text()
    assert "phase 1" in table and "phase 3" in table
    assert "DRF equilibrium" in "\n".join(lines)
    assert [r.phase for r in written.rows] == [1, 1, 2, 2, 3, 3]

    # The comparison needs every policy's CSV; with them all, it is drawn.
    assert comparison(tmp_path, config) is None
    for policy in ("asset", "slots"):
        shutil.copy(written.csv, tmp_path / f"dynamic-sharing-{policy}.csv")
    figure = comparison(tmp_path, config)
    assert figure is not None and figure.read_bytes().startswith(b"\x89PNG")


def test_command_line() -> None:
    args = build_parser().parse_args(
        ["experiment", "dynamic-sharing", "--policy", "all", "--task-seconds", "1", "2"]
    )
    assert (args.experiment, args.policy, args.task_seconds) == ("dynamic-sharing", "all", [1, 2])
    assert args.agents == 48 and args.out == Path("docs/experiment")


class RecordingJob(PhasedJob):
    """A PhasedJob whose calls to the master are recorded instead of sent."""

    def __init__(self, hold_seconds: float) -> None:
        super().__init__(
            "job1",
            [Resources(cpus=2, mem=4096), Resources(cpus=1, mem=7168)],
            (1.0, 2.0),
            seed=1,
            hold_seconds=hold_seconds,
            agent_capacity=Resources(cpus=4, mem=14336),
        )
        self.calls: list[tuple[str, list[str]]] = []

    async def launch(
        self,
        offers: Offer | Sequence[Offer],
        tasks: Sequence[TaskSpec],
        refuse_seconds: float | None = None,
    ) -> str:
        ids = [o.offer_id for o in ([offers] if isinstance(offers, Offer) else offers)]
        self.calls.append(("launch", ids))
        return "call"

    async def decline(
        self, offers: Offer | Sequence[Offer], refuse_seconds: float | None = None
    ) -> str:
        ids = [o.offer_id for o in ([offers] if isinstance(offers, Offer) else offers)]
        self.calls.append(("decline", ids))
        return "call"

    async def suppress(self) -> str:
        self.calls.append(("suppress", []))
        return "call"


def offer(offer_id: str, cpus: float, mem: float, agent_id: str = "a1") -> Offer:
    return Offer(offer_id, "fw", agent_id, agent_id, Resources(cpus=cpus, mem=mem))


async def test_a_job_combines_a_held_offer_with_the_next_one_on_the_same_agent() -> None:
    job = RecordingJob(hold_seconds=60)
    await job.on_subscribed("fw", resubscribed=False)
    await job.on_offers([offer("o1", cpus=1, mem=8192)])  # one CPU short of <2 CPUs, 4 GB>
    assert job.calls == []  # held
    await job.on_offers([offer("o2", cpus=1, mem=1024, agent_id="a2")])  # another agent
    await job.on_offers([offer("o3", cpus=1, mem=0)])
    assert job.calls == [("launch", ["o1", "o3"])]
    assert job.stats.launched == job.stats.combined == 1
    await job.wind_down()  # asks for no more offers and gives back what it holds (o2)
    assert job.calls[-2:] == [("suppress", []), ("decline", ["o2"])]


async def test_a_job_declines_what_can_never_fit_or_when_not_holding() -> None:
    job = RecordingJob(hold_seconds=60)
    job.phase = 1  # <1 CPU, 7 GB> tasks
    await job.on_offers([offer("o1", cpus=4, mem=14336)])
    await job.on_offers([offer("o2", cpus=3, mem=7168)])  # a second task fits beside it
    assert [c[0] for c in job.calls] == ["launch", "launch"]
    # Our two tasks hold all 14 GB: a third can never fit there, so nothing is held.
    await job.on_offers([offer("o3", cpus=2, mem=0)])
    assert job.calls[-1] == ("decline", ["o3"])

    eager = RecordingJob(hold_seconds=0)
    await eager.on_offers([offer("o1", cpus=1, mem=8192)])
    assert eager.calls == [("decline", ["o1"])]
