"""The sglang 0.5.23 wheel cut to what the side-by-side harness reads (``upstream_wheel.FILES``) and
its ``RECORD``, for the device tool, which takes at most 64 MiB a call: the repository's tree is ~28 MB
and the whole wheel 38 MB, the cut one ~0.3 MB. Each file is checked against the wheel's ``RECORD``
here and again where ``upstream_wheel.unpack`` reads the cut file, so a record made from it names the
same upstream files (its ``upstream.wheel`` and ``wheel_sha256`` are the cut file's).

    python3 scripts/gpu/cut_wheel.py sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl .carry/trim/sglang-0.5.23-lora-files.zip
"""
from __future__ import annotations

import io
import sys
import zipfile
from pathlib import Path

from inkling_lab.atomic import atomic_write
from inkling_lab.upstream_wheel import FILES, RECORD_PATH, opened_wheel, read_checked


def cut(wheel: str | Path, out: str | Path) -> Path:
    """Write ``out`` (atomically): a zip of the wheel's ``FILES`` (each checked against its ``RECORD``) and
    that ``RECORD``, the same bytes for the same wheel. Raises naming the file that does not match, and
    writes nothing then."""
    files = read_checked(wheel, FILES)
    buf = io.BytesIO()
    with opened_wheel(wheel) as w, zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name in (*FILES, RECORD_PATH):  # each entry's own date: the same wheel cuts to the same bytes
            z.writestr(w.getinfo(name), files[name] if name in files else w.read(name))
    return atomic_write(out, buf.getvalue())


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(cut(sys.argv[1], sys.argv[2]))
