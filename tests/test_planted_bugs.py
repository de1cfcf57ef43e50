"""scripts/planted_bugs.py stays aimed at live code.

Each planted bug is a text replacement; when the code it patches changes, the bug no
longer applies and `planted_bugs.py` stops with "code not found once" for it, which
nobody sees until someone runs the (slow) script. This checks the aim of every bug
at once, in the unit layer: its file exists, its text occurs there exactly once, and
the replacement differs. It does not check that a bug is caught: that is the script's
job, run by whoever changes the code a bug patches.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parent.parent


def _script() -> ModuleType:
    return load_script("planted_bugs")


def test_every_planted_bug_patches_text_found_exactly_once() -> None:
    script = _script()
    bugs = [b for v in vars(script).values() if isinstance(v, list) for b in v]
    bugs = [b for b in bugs if isinstance(b, script.Bug)]
    assert len(bugs) > 100
    names = [b.name for b in bugs]
    assert len(set(names)) == len(names), "two planted bugs share a name"
    off_target = {
        b.name: (
            b.path,
            (ROOT / b.path).read_text().count(b.old) if (ROOT / b.path).exists() else "no file",
        )
        for b in bugs
        if not (ROOT / b.path).exists() or (ROOT / b.path).read_text().count(b.old) != 1
    }
    assert off_target == {}
    assert [b.name for b in bugs if b.old == b.new] == []
