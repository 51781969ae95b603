"""``python -m inkling_lab.profile ...``: the same as ``inkling-lab profile ...``."""
from .command import main

raise SystemExit(main())
