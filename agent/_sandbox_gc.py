"""Removing the sandboxes of ended tasks, as `agent/gc_policy.py` decides.

Each pass: list the task directories under `<work_dir>/sandboxes/` and
`<work_dir>/meta/` with their modification times (in a worker thread), read the
filesystem's usage, ask `gc_policy.plan`, and remove what it says. The agent's
task runner says which tasks are live (running, or ended and not yet
acknowledged); they are never removed.

A removal must not race a launch of the same task id (ids may be used again).
So each one is decided and started on the event loop, where launches are made:
the task is checked again to not be live, then its two directories are renamed
into `<work_dir>/gc-trash/` (one rename each, on the same filesystem); a launch
that comes after that finds no sandbox and makes a new one. The renamed
directories are deleted in a worker thread. A framework's directory is removed
once empty and none of its tasks is live. Whatever a crash left in the trash is
deleted at the next start.

Passes run after the agent recovered its tasks, every `interval` seconds at the
latest, and sooner when a sandbox comes due.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import stat
import time
import uuid
from collections.abc import Callable, Set
from pathlib import Path

import structlog

from mesolite.agent._task_records import CHECKPOINT_FILE, RECORDS_DIR, SANDBOXES_DIR
from mesolite.agent.gc_policy import EndedSandbox, GcConfig, GcPlan, TaskKey, plan

log = structlog.get_logger(__name__)

TRASH_DIR = "gc-trash"
# A task's two directories, and what in each tells when it was last written (None:
# the directory itself).
_ROOTS = (SANDBOXES_DIR, RECORDS_DIR)
_MARKERS = (None, CHECKPOINT_FILE)


def filesystem_usage(path: Path) -> float:
    """The used fraction of the filesystem holding `path` (as Mesos: blocks not free)."""
    st = os.statvfs(path)
    if st.f_blocks == 0:
        return 0.0
    return (st.f_blocks - st.f_bfree) / st.f_blocks


def scan(work_dir: Path) -> list[EndedSandbox]:
    """Every task directory under sandboxes/ and meta/, by task, with the latest of the
    modification times of its sandbox (set as its task ended) and of its records (an
    older agent's task.json, or the directory)."""
    written: dict[TaskKey, float] = {}
    for name, marker in zip(_ROOTS, _MARKERS, strict=True):
        root = work_dir / name
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            for framework in os.scandir(root):
                if not framework.is_dir(follow_symlinks=False):
                    continue
                with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                    for task in os.scandir(framework.path):
                        if not task.is_dir(follow_symlinks=False):
                            continue
                        mtime = _mtime(Path(task.path), marker)
                        if mtime is None:
                            continue
                        key = (framework.name, task.name)
                        written[key] = max(written.get(key, mtime), mtime)
    return [EndedSandbox(key, at) for key, at in written.items()]


def _mtime(directory: Path, marker: str | None) -> float | None:
    try:
        if marker is not None:
            with contextlib.suppress(FileNotFoundError):
                return os.stat(directory / marker, follow_symlinks=False).st_mtime
        return os.stat(directory, follow_symlinks=False).st_mtime
    except OSError:
        return None


def _delete(path: Path) -> None:
    """Delete a tree the agent moved to its trash; a directory a task left without
    write permission is made writable (as the agent's user) and tried again."""

    def retry(function: Callable[..., object], name: str, _: object) -> None:
        parent = os.path.dirname(name)
        with contextlib.suppress(OSError):
            os.chmod(parent, stat.S_IRWXU)
            if os.path.isdir(name) and not os.path.islink(name):
                os.chmod(name, stat.S_IRWXU)
        function(name)

    try:
        shutil.rmtree(path, onerror=retry)
    except OSError as e:
        log.warning("could not delete a removed sandbox", path=str(path), error=str(e))


class SandboxGc:
    """Runs the passes for an agent (see the module docstring)."""

    def __init__(
        self,
        work_dir: Path,
        config: GcConfig,
        live: Callable[[], Set[TaskKey]],
        *,
        disk_usage: Callable[[Path], float] = filesystem_usage,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._work_dir = work_dir
        self._config = config
        self._live = live
        self._disk_usage = disk_usage
        self._clock = clock
        self._trash = work_dir / TRASH_DIR
        self.removed = 0  # sandboxes removed since start

    async def run(self) -> None:
        """Pass after pass, until cancelled."""
        await asyncio.to_thread(self._empty_trash)
        while True:
            try:
                next_pass = (await self.collect()).next_pass
            except Exception:
                log.exception("sandbox garbage collection failed")
                next_pass = self._config.interval
            await asyncio.sleep(max(next_pass, 0.01))

    async def collect(self) -> GcPlan:
        """One pass: remove what is due now; the plan it followed."""
        sandboxes, usage = await asyncio.to_thread(self._look)
        decided = plan(sandboxes, self._live(), self._clock(), usage, self._config)
        trashed: list[Path] = []
        for sandbox in decided.remove:
            trashed.extend(self._take(sandbox, decided, usage))
        if trashed:
            await asyncio.to_thread(self._delete_all, trashed)
            self._remove_empty_frameworks({s.key[0] for s in decided.remove})
        return decided

    def _look(self) -> tuple[list[EndedSandbox], float]:
        return scan(self._work_dir), self._disk_usage(self._work_dir)

    def _take(self, sandbox: EndedSandbox, decided: GcPlan, usage: float) -> list[Path]:
        """On the loop: move a task's directories to the trash, if it is still not live."""
        framework_id, task_id = sandbox.key
        if sandbox.key in self._live():  # launched again since the scan
            return []
        sources = [self._work_dir / root / framework_id / task_id for root in _ROOTS]
        written = [_mtime(path, marker) for path, marker in zip(sources, _MARKERS, strict=True)]
        if max((w for w in written if w is not None), default=0.0) > sandbox.written_at:
            return []  # written since the scan (launched and ended again): next pass
        moved = []
        for root, source in zip(_ROOTS, sources, strict=True):
            target = self._trash / f"{uuid.uuid4().hex}-{root}"
            try:
                self._trash.mkdir(mode=0o700, exist_ok=True)
                os.rename(source, target)
            except FileNotFoundError:
                continue
            except OSError as e:
                log.warning(
                    "could not remove a sandbox",
                    framework_id=framework_id,
                    task_id=task_id,
                    path=str(source),
                    error=str(e),
                )
                continue
            moved.append(target)
        if moved:
            self.removed += 1
            log.info(
                "sandbox removed",
                framework_id=framework_id,
                task_id=task_id,
                age=round(self._clock() - sandbox.written_at, 1),
                allowed_age=round(decided.allowed_age, 1),
                disk_usage=round(usage, 3),
            )
        return moved

    @staticmethod
    def _delete_all(paths: list[Path]) -> None:
        for path in paths:
            _delete(path)

    def _remove_empty_frameworks(self, framework_ids: Set[str]) -> None:
        """On the loop: a framework's directories, once empty and none of its tasks live."""
        live = {framework_id for framework_id, _ in self._live()}
        for framework_id in framework_ids - live:
            for root in _ROOTS:
                with contextlib.suppress(OSError):  # not empty, or gone
                    os.rmdir(self._work_dir / root / framework_id)

    def _empty_trash(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self._trash):
                _delete(Path(entry.path))


__all__ = ["TRASH_DIR", "SandboxGc", "filesystem_usage", "scan"]
