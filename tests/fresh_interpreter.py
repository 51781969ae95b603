"""What a fresh interpreter imports and opens on ``import inkling_lab``, then ``import
inkling_lab.profile``: one launch (a torch import, seconds on a busy machine) answers the
two tests that ask (``test_package.py``: the package needs only torch; ``test_profile.py``:
the profiler reads no file at import), once per test process."""
from __future__ import annotations

import functools
import json
import subprocess
import sys

_CODE = """\
import builtins, io, json, sys
opened = []
real = io.open
def spy(f, *a, **k):
    opened.append(str(f))
    return real(f, *a, **k)
io.open = builtins.open = spy
import inkling_lab
heavy = [m for m in ('matplotlib', 'ipywidgets', 'safetensors', 'triton') if m in sys.modules]
import inkling_lab.profile
print(json.dumps({'heavy_after_the_package': heavy, 'json_opened': [f for f in opened if f.endswith('.json')]}))
"""


@functools.cache
def fresh_imports() -> dict[str, list[str]]:
    """``heavy_after_the_package``: which of matplotlib, ipywidgets, safetensors, triton
    ``import inkling_lab`` imported; ``json_opened``: the ``.json`` files opened by both
    imports (every ``open`` is watched from before the first)."""
    done = subprocess.run([sys.executable, "-c", _CODE], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
