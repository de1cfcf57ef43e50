"""The framework SDK's public surface, its docstring example, and its small helpers."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

from mesolite import framework_sdk
from mesolite.agent import _task_env as task_env
from mesolite.backoff import Backoff
from mesolite.framework_sdk import Framework, StatusSource, new_task_id
from mesolite.framework_sdk._ids import RecentIds

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
REFERENCE_SCRIPT = EXAMPLES.parent / "scripts" / "gen_sdk_reference.py"


def test_the_public_names_are_pinned() -> None:
    assert framework_sdk.__all__ == [
        "DEFAULT_FAILOVER_TIMEOUT",
        "ConnectionConfig",
        "Framework",
        "FrameworkGone",
        "FrameworkRejected",
        "InvalidCall",
        "MesoliteError",
        "NotConnected",
        "Offer",
        "Resources",
        "RpcError",
        "StatusSource",
        "TaskSpec",
        "TaskState",
        "TaskStatus",
        "TlsConfig",
        "new_task_id",
    ]
    for name in framework_sdk.__all__:
        assert getattr(framework_sdk, name) is not None


def test_every_error_derives_from_the_one_root() -> None:
    errors = [framework_sdk.FrameworkRejected, framework_sdk.NotConnected, framework_sdk.RpcError]
    assert all(issubclass(e, framework_sdk.MesoliteError) for e in errors)
    assert issubclass(framework_sdk.FrameworkRejected, framework_sdk.RpcError)
    assert issubclass(framework_sdk.FrameworkGone, framework_sdk.FrameworkRejected)
    # Every exception any module of the SDK defines, public or not (StreamLost...).
    defined = [
        value
        for module in pkgutil.iter_modules(framework_sdk.__path__, "mesolite.framework_sdk.")
        for value in vars(importlib.import_module(module.name)).values()
        if isinstance(value, type) and issubclass(value, BaseException)
    ]
    assert {e.__name__ for e in defined} >= {"FrameworkGone", "StreamLost", "InvalidCall"}
    assert [e for e in defined if not issubclass(e, framework_sdk.MesoliteError)] == []


def test_every_public_name_and_member_has_a_docstring() -> None:
    """What scripts/gen_sdk_reference.py checks before writing docs/reference/ (griffe
    reads field and enum member docstrings, which `inspect` cannot see)."""
    pytest.importorskip("griffe2md")
    spec = importlib.util.spec_from_file_location("gen_sdk_reference", REFERENCE_SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    _, objects = script.load()
    assert script.undocumented(objects) == []
    assert {o.name for o in objects} == set(framework_sdk.__all__)


def test_the_framework_api_is_pinned() -> None:
    public = sorted(n for n in vars(Framework) if not n.startswith("_"))
    assert public == [
        "connected",
        "declare_demand",
        "decline",
        "kill",
        "launch",
        "on_agent_lost",
        "on_disconnected",
        "on_error",
        "on_offers",
        "on_preemption",
        "on_rescind",
        "on_subscribed",
        "on_update",
        "outstanding_offers",
        "reconcile",
        "revive",
        "run",
        "stop",
        "suppress",
        "teardown",
    ]
    for name in public:
        member = getattr(Framework, name)
        if callable(member):
            assert inspect.iscoroutinefunction(member), name


def test_connection_settings_are_one_object_with_the_old_defaults() -> None:
    connection = framework_sdk.ConnectionConfig()
    assert (connection.reconnect_initial, connection.reconnect_max) == (0.5, 30.0)
    assert (connection.subscribe_timeout, connection.stop_grace) == (10.0, 2.0)
    assert connection.reconnect_backoff == Backoff(0.5, 30.0)
    assert connection.reconcile_timeout == 120.0
    assert Framework("f").connection == connection
    fast = framework_sdk.ConnectionConfig(reconnect_initial=0.01, reconnect_max=0.1)
    assert Framework("f", connection=fast).connection is fast


def test_a_subclass_setting_a_connection_attribute_is_told_where_it_went() -> None:
    with pytest.raises(TypeError, match="reconnect_max: pass connection=ConnectionConfig"):

        class Old(Framework):
            reconnect_max = 1.0


def test_the_docstring_example_is_examples_hello_framework() -> None:
    doc = framework_sdk.__doc__ or ""
    example: list[str] = []
    for line in doc.split("::\n", 1)[1].splitlines():
        if line and not line.startswith("    "):
            break  # the end of the literal block
        example.append(line.removeprefix("    "))
    source = (EXAMPLES / "hello_framework.py").read_text()
    # The example is the script without its module docstring.
    assert "\n".join(example).strip() == source.split('"""\n', 1)[1].strip()


def test_task_ids_are_unique_and_prefixed() -> None:
    ids = {new_task_id("web") for _ in range(1000)}
    assert len(ids) == 1000
    assert all(re.fullmatch(r"web-[0-9a-f]{12}", i) for i in ids)


def test_backoff_doubles_with_jitter_up_to_the_cap() -> None:
    backoff = Backoff(1.0, 8.0)
    low = [backoff.delay(n, lambda: 1.0) for n in range(6)]
    high = [backoff.delay(n, lambda: 0.0) for n in range(6)]
    assert low == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert high == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert backoff.delay(2000, lambda: 0.0) == 8.0  # no overflow, however long


def test_recent_ids_forget_the_oldest() -> None:
    recent = RecentIds(capacity=2)
    for update_id in ("u1", "u2", "u1", "u3"):
        recent.add(update_id)
    assert "u1" in recent and "u3" in recent and "u2" not in recent


def test_readme_shows_the_hello_example_as_it_is() -> None:
    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text()
    block = readme.split("```python\n", 1)[1].split("```", 1)[0]
    example = (root / "examples" / "hello_framework.py").read_text()
    code = example.split('"""', 2)[2].lstrip("\n")  # without the module docstring
    assert block == code


def test_the_guide_covers_every_field_state_call_and_callback() -> None:
    """docs/framework-guide.md names every field of the public types, every task state,
    every call and callback and the task's MESOLITE_* variables (so a new one cannot
    be added without a word there)."""
    guide = (EXAMPLES.parent / "docs" / "framework-guide.md").read_text()
    names = [
        f.name
        for cls in (
            framework_sdk.Offer,
            framework_sdk.TaskSpec,
            framework_sdk.TaskStatus,
            framework_sdk.ConnectionConfig,
            framework_sdk.TlsConfig,
        )
        for f in dataclasses.fields(cls)
    ]
    names += [s.value for s in framework_sdk.TaskState] + [s.name for s in StatusSource]
    names += [n for n in vars(Framework) if not n.startswith("_")]
    names += ["name", "role", "failover_timeout", "framework_id", "id_file", "connection"]
    names += ["MESOLITE_FRAMEWORK_ID", "MESOLITE_TASK_ID", "MESOLITE_SANDBOX"]
    names += ["MESOLITE_AGENT_ID", "FrameworkGone", "DEFAULT_FAILOVER_TIMEOUT"]
    names += [n for n in task_env.PASSED]
    missing = [n for n in names if f"`{n}" not in guide]
    assert missing == []
