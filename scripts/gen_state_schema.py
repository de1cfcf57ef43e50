"""Write docs/state.schema.json from the snapshot types, or check that it is current.

    python scripts/gen_state_schema.py          # rewrite the schema
    python scripts/gen_state_schema.py --check  # exit 1 if it is stale

The schema of GET /state is generated from `mesolite.snapshot.ClusterSnapshot`,
the types the master writes /state from and the CLI reads it with, so it says
what the code does; it is committed so tools can read it without mesolite.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mesolite.snapshot import state_json_schema

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "docs" / "state.schema.json"


def render() -> str:
    return json.dumps(state_json_schema(), indent=2) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the schema is stale")
    args = parser.parse_args()
    fresh = render()
    where = SCHEMA.relative_to(ROOT)
    if args.check:
        if not SCHEMA.exists() or SCHEMA.read_text() != fresh:
            print(f"{where} is stale; run scripts/gen_state_schema.py")
            return 1
        print(f"{where} is current")
        return 0
    SCHEMA.write_text(fresh)
    print(f"wrote {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
