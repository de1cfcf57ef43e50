"""A framework's memory across restarts of its process: its id, and the updates shown.

`<id_file>` holds the framework id the master assigned; `<id_file>.shown` lists the
update ids already shown to `on_update`, so a restarted process does not see them
again. Both go on `teardown()`. When the master no longer knows the id (NOT_FOUND: the
failover timeout passed, or the framework was torn down), the id file is renamed to
`<id_file>.stale` (its successor registers afresh; the old id stays on disk for the
operator to look up) and the `.shown` list is removed.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from mesolite.files import write_atomically


class IdFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.shown_path = _sibling(path, ".shown")
        self.stale_path = _sibling(path, ".stale")

    def read(self) -> str | None:
        """The id kept there, or None when there is none yet."""
        if not self.path.exists():
            return None
        return self.path.read_text().strip() or None

    def write(self, framework_id: str) -> None:
        write_atomically(self.path, framework_id.encode())

    def shown(self, last: int) -> Iterable[str]:
        """The last `last` update ids already shown, oldest first."""
        if not self.shown_path.exists():
            return []
        return [line.strip() for line in self.shown_path.read_text().splitlines()[-last:]]

    def remember_shown(self, update_id: str) -> None:
        # Written before the acknowledgement leaves: if the process dies in between,
        # the next one knows the update was shown.
        with self.shown_path.open("a") as f:
            f.write(update_id + "\n")

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
        self.shown_path.unlink(missing_ok=True)

    def retire(self, framework_id: str) -> Path | None:
        """Move the id aside if it still names `framework_id`; where it went, or None
        if the file holds another id (or none) and was left alone."""
        if self.read() != framework_id:
            return None
        self.path.replace(self.stale_path)
        self.shown_path.unlink(missing_ok=True)
        return self.stale_path


def _sibling(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)
