"""scripts/profile_shares.py: samples counted under the right area (the README's
profile of the agent's task work is read with it)."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.support.scripts import load_script

pytestmark = pytest.mark.unit


def _script() -> ModuleType:
    return load_script("profile_shares")


def test_a_stack_counts_under_its_first_area() -> None:
    raw = (
        "run (a.py:1);TaskProcesses._set_up (p.py:2);TaskLog.append (l.py:3) 3\n"
        "run (a.py:1);TaskProcesses._set_up (p.py:2) 2\n"
        "run (a.py:1);Handle._run (events.py:80) 5\n"
    )
    shares = _script().gil_shares(raw)
    assert shares == {
        "checkpoints and records written": 3,
        "set-up (sandbox, records, cgroup and its limits)": 2,
        "other": 5,
    }


def test_kernel_samples_count_by_system_call_and_filesystem_of_one_process() -> None:
    script = (
        "10/11 \n"
        "\tffff __ext4_new_inode ([kernel.kallsyms])\n"
        "\tffff __mem_cgroup_charge ([kernel.kallsyms])\n"
        "\tffff __x64_sys_openat ([kernel.kallsyms])\n"
        "\n"
        "10/12 \n"
        "\tffff kernfs_iop_mkdir ([kernel.kallsyms])\n"
        "\tffff __x64_sys_mkdir ([kernel.kallsyms])\n"
        "\n"
        "10/10 \n"
        "\t1234 _PyEval_EvalFrameDefault (libpython3.11.so)\n"
        "\n"
        "20/20 \n"
        "\tffff __x64_sys_fsync ([kernel.kallsyms])\n"
    )
    shares = _script().kernel_shares(script, "10")
    assert shares == {"openat (ext4)": 1, "mkdir (cgroupfs)": 1, "user": 1}
