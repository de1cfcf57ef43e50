"""Default resource detection and the agent package's public surface."""

from __future__ import annotations

from pathlib import Path

from mesolite import agent
from mesolite.agent.resources import detect_resources, usable_mb
from mesolite.resources import Resources

GB = 1024**3


def test_public_names_are_pinned() -> None:
    assert sorted(agent.__all__) == [
        "Agent",
        "AgentConfig",
        "AgentError",
        "AgentRegistrationError",
        "Backoff",
        "GcConfig",
        "IsolationConfig",
        "IsolationMode",
        "TaskRunner",
        "TaskTransition",
        "detect_resources",
    ]


def test_memory_rule_leaves_one_gb_or_half() -> None:
    assert usable_mb(16 * GB, reserve=GB, threshold=2 * GB) == 15 * 1024
    assert usable_mb(2 * GB, reserve=GB, threshold=2 * GB) == 1024
    assert usable_mb(GB, reserve=GB, threshold=2 * GB) == 512


def test_disk_rule_leaves_five_gb_or_half() -> None:
    assert usable_mb(100 * GB, reserve=5 * GB, threshold=10 * GB) == 95 * 1024
    assert usable_mb(8 * GB, reserve=5 * GB, threshold=10 * GB) == 4 * 1024


def test_detects_what_is_not_given(tmp_path: Path) -> None:
    detected = detect_resources(tmp_path / "not-yet-created", Resources(cpus=1.5, gpus=1))
    assert detected["cpus"] == 1.5
    assert detected["gpus"] == 1
    assert detected["mem"] > 0
    assert detected["disk"] > 0
