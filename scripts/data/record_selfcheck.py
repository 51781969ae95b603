"""Record what ``inkling-lab selfcheck`` says of every sglang release with the shared sink.

    INKLING_LAB_WHEELS=/path/to/wheels .venv/bin/python scripts/data/record_selfcheck.py [--download]

For each release of ``inkling_lab.catalog.RELEASES`` (0.5.16 ... 0.5.23) it runs
``selfcheck`` on that release's wheel from the cache (``$INKLING_LAB_WHEELS``, else
``~/.cache/inkling-lab/wheels``; ``--download`` fetches the missing ones once with pip)
and writes ``data/releases/selfcheck.json``: the environment (date, commit, the
command), and per release the wheel's name and sha256, whether the release table knows
it, and per area its verdict, the number of cases and the first disagreement. A release
whose wheel is missing is an error: the record covers them all or is not written.
Never edit the record by hand: run this again.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from inkling_lab.catalog import RELEASES
from inkling_lab.records import environment, write_json
from inkling_lab.selfcheck import cached_wheel, download, selfcheck, wheel_cache
from inkling_lab.upstream_wheel import file_sha256

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "data" / "releases" / "selfcheck.json"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--download", action="store_true", help="fetch the releases' wheels missing from the cache")
    p.add_argument("--cases", type=int, default=300, help="generated cases per area (default 300)")
    p.add_argument("--out", type=Path, default=RECORD)
    args = p.parse_args(argv)
    cache = wheel_cache()
    wheels = {v: download(v, cache) if args.download else cached_wheel(v, cache) for v in RELEASES}
    missing = [v for v, w in wheels.items() if w is None]
    if missing:
        print(f"no wheel in {cache} for sglang {', '.join(missing)}: pass --download, or set $INKLING_LAB_WHEELS",
              file=sys.stderr)
        return 2
    releases = {}
    for version, wheel in wheels.items():
        report = selfcheck(wheel, cases=args.cases)
        print(report, end="\n\n")
        releases[version] = {**report.to_dict(), "wheel_sha256": file_sha256(wheel)}
    command = "python scripts/data/record_selfcheck.py" + (" --download" if args.download else "") + (
        f" --cases {args.cases}" if args.cases != 300 else "")
    write_json(args.out, {"environment": environment(command), "cases_per_area": args.cases,
                          "releases": releases})
    print(f"wrote {args.out}")
    return 0 if all(r["agrees"] for r in releases.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
