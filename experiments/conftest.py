"""The experiments' tests share the library tests' helpers (``tests/interpreted.py``:
kernel modules imported for Triton's CPU interpreter)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from interpreted import import_triton_for_the_interpreter  # noqa: E402

import_triton_for_the_interpreter()
