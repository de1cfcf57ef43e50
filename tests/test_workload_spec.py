"""The workload file format (mesolite/workloads/spec.py): what it accepts, and every
problem reported with the file and line, nothing half-parsed."""

from __future__ import annotations

from pathlib import Path

import pytest

from mesolite.resources import Resources
from mesolite.workloads.spec import (
    MAX_FILE_BYTES,
    JobSpec,
    Restart,
    RestartPolicy,
    ServiceSpec,
    WorkloadFileError,
    load_workload,
    parse_workload,
)

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

JOB = """\
[job]
name = "sweep"
command = "echo $MESOLITE_JOB_INDEX"
resources = { cpus = 0.5, mem = 256 }
completions = 20
parallelism = 6
retries = 2
"""


def test_the_committed_examples_are_the_two_workloads_of_the_issue() -> None:
    sweep = load_workload(EXAMPLES / "sweep.toml")
    assert isinstance(sweep, JobSpec)
    assert (sweep.completions, sweep.parallelism, sweep.retries) == (20, 6, 2)
    ticker = load_workload(EXAMPLES / "ticker.toml")
    assert isinstance(ticker, ServiceSpec)
    assert ticker.instances == 3 and ticker.restart.policy is RestartPolicy.ALWAYS
    for path in (EXAMPLES / "sweep.toml", EXAMPLES / "ticker.toml"):
        assert len(path.read_text().splitlines()) <= 20, f"{path.name}: about 20 lines"


def test_a_job_with_defaults() -> None:
    spec = parse_workload('[job]\nname = "a"\ncommand = "true"\nresources = { cpus = 1 }\n')
    assert spec == JobSpec("a", "true", Resources(cpus=1), completions=1, parallelism=1)
    assert spec.role == "*" and spec.retries == 0 and dict(spec.env) == {}


def test_a_service_with_everything() -> None:
    spec = parse_workload(
        "[service]\n"
        'name = "web-1"\n'
        'role = "eng/web"\n'
        "command = '''\nexec ./serve\n'''\n"
        "resources = { cpus = 0.25, mem = 64, gpus = 1 }\n"
        "instances = 3\n"
        'env = { MODE = "prod" }\n'
        'restart = { policy = "on-failure", backoff = 0.5, factor = 3, max_backoff = 10 }\n'
    )
    assert spec == ServiceSpec(
        "web-1",
        "exec ./serve\n",
        Resources(cpus=0.25, mem=64, gpus=1),
        instances=3,
        restart=Restart(RestartPolicy.ON_FAILURE, 0.5, 3.0, 10.0),
        role="eng/web",
        env={"MODE": "prod"},
    )


def test_restart_delays_grow_and_stop_at_the_most() -> None:
    restart = Restart(backoff=1, factor=2, max_backoff=10)
    assert [restart.delay(n) for n in range(6)] == [1, 2, 4, 8, 10, 10]
    assert restart.delay(10**9) == 10  # no overflow
    assert Restart(backoff=0).delay(5) == 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            JOB.replace("parallelism = 6", "parallelism = 0"),
            "f.toml:6: parallelism must be a whole number from 1 to 1000, got 0",
        ),
        (
            JOB.replace("completions = 20", "completions = 10001"),
            "f.toml:5: completions must be a whole number from 1 to 10000, got 10001",
        ),
        (
            JOB.replace("retries = 2", "retries = true"),
            "f.toml:7: retries must be a whole number from 0 to 100, got True",
        ),
        (
            JOB.replace("retries = 2", "retries = 101"),
            "f.toml:7: retries must be a whole number from 0 to 100, got 101",
        ),
        (
            JOB + "instances = 3\n",
            "f.toml:8: unknown key 'instances' in [job]; known: name, command, resources, "
            "completions, parallelism, retries, role, env",
        ),
        (
            JOB.replace('name = "sweep"', 'name = "no spaces"'),
            "f.toml:2: name must be 1-63 letters, digits, '_' and '-', starting with a letter "
            "or digit; got 'no spaces'",
        ),
        (JOB.replace('name = "sweep"', f'name = "{"n" * 64}"'), "f.toml:2: name must be 1-63"),
        (
            JOB.replace('command = "echo $MESOLITE_JOB_INDEX"\n', ""),
            "f.toml:1: [job] needs 'command'",
        ),
        (
            JOB.replace('"echo $MESOLITE_JOB_INDEX"', '"  "'),
            "f.toml:3: command must be a non-empty",
        ),
        (
            JOB.replace("cpus = 0.5", "cpus = -1"),
            "f.toml:4: resources cpus = -1: must be a number from 0.001 to 1e+09",
        ),
        (JOB.replace("cpus = 0.5", "cpus = 0.0001"), "f.toml:4: resources cpus = 0.0001"),
        (JOB.replace("cpus = 0.5", 'cpus = "1"'), "f.toml:4: resources cpus = '1'"),
        (
            JOB.replace("resources = { cpus = 0.5, mem = 256 }", "resources = {}"),
            "f.toml:4: resources must be a table",
        ),
        (JOB + 'role = "a//b"\n', "f.toml:8: invalid role 'a//b'"),
        (
            JOB + 'env = { MESOLITE_TASK_ID = "x" }\n',
            "f.toml:8: MESOLITE_TASK_ID: names starting MESOLITE_ are mesolite's",
        ),
        (JOB + "env = { N = 1 }\n", "f.toml:8: env N must be a string"),
        (JOB + 'env = { "A B" = "x" }\n', "f.toml:8: invalid environment variable name 'A B'"),
        (JOB + "[service]\n", "f.toml:8: a file holds one [job] or one [service], not both"),
        ("[jobs]\n", "f.toml:1: unknown key 'jobs': a file holds one [job] or one [service]"),
        ("", "f.toml: expected a [job] or a [service] table"),
        ("[job]\nname = \n", "f.toml:2: invalid TOML"),
        (
            JOB.replace("[job]", "[service]")
            .replace("completions = 20\n", "")
            .replace("parallelism = 6\n", "")
            .replace("retries = 2\n", "")
            + 'restart = { policy = "sometimes" }\n',
            "f.toml:5: restart policy must be 'always' or 'on-failure', got 'sometimes'",
        ),
        (
            JOB.replace("[job]", "[service]")
            .replace("completions = 20\n", "")
            .replace("parallelism = 6\n", "")
            .replace("retries = 2\n", "")
            + "restart = { backoff = 10, max_backoff = 5 }\n",
            "f.toml:5: max_backoff 5 is below backoff 10",
        ),
        (
            JOB.replace("[job]", "[service]")
            .replace("completions = 20\n", "")
            .replace("parallelism = 6\n", "")
            .replace("retries = 2\n", "")
            + "restart = { factor = 0.5 }\n",
            "f.toml:5: restart factor must be a number from 1 to 10, got 0.5",
        ),
        (
            JOB.replace("[job]", "[service]")
            .replace("completions = 20\n", "")
            .replace("parallelism = 6\n", "")
            .replace("retries = 2\n", "")
            + "instances = 1001\n",
            "f.toml:5: instances must be a whole number from 1 to 1000, got 1001",
        ),
    ],
)
def test_problems_are_reported_with_the_file_and_line(text: str, message: str) -> None:
    with pytest.raises(WorkloadFileError) as caught:
        parse_workload(text, "f.toml")
    assert str(caught.value).startswith(message), str(caught.value)


def test_a_script_in_the_command_does_not_mislead_the_line_numbers() -> None:
    """`name=x` and `[ -e f ]` inside a multi-line command are not keys or tables."""
    text = (
        "[job]\n"
        "command = '''\n"
        "name=x\n"
        "[ -e f ] && parallelism=9\n"
        "'''\n"
        'name = "ok"\n'
        "resources = { cpus = 1 }\n"
        "parallelism = -1\n"
    )
    with pytest.raises(WorkloadFileError, match=r"^f.toml:8: parallelism"):
        parse_workload(text, "f.toml")


def test_sizes_are_bounded() -> None:
    with pytest.raises(WorkloadFileError, match="larger than"):
        parse_workload("#" * (MAX_FILE_BYTES + 1), "f.toml")
    long_command = JOB.replace('"echo $MESOLITE_JOB_INDEX"', '"' + "x" * 40_000 + '"')
    with pytest.raises(WorkloadFileError, match="command is longer than"):
        parse_workload(long_command, "f.toml")
    many = ", ".join(f'V{i} = "x"' for i in range(65))
    with pytest.raises(WorkloadFileError, match="more than 64 environment variables"):
        parse_workload(JOB + f"env = {{ {many} }}\n", "f.toml")
    with pytest.raises(WorkloadFileError, match="not UTF-8"):
        parse_workload(b"[job]\nname = '\xff'\n", "f.toml")


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(WorkloadFileError, match=r"missing.toml: cannot read it"):
        load_workload(tmp_path / "missing.toml")
