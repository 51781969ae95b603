"""matplotlib figures that explain the shared sink at a glance. Each function takes
plain values, returns a ``Figure`` and holds no domain logic of its own."""
from __future__ import annotations

import matplotlib

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

# -- core (issue 2): layouts, buffers, derived operands --------------------------------

# -- adapters (issue 3) -------------------------------------------------------------------

# -- forward and profiling (issue 4) ----------------------------------------------------

# -- tensor parallelism (issue 5) -------------------------------------------------------

# -- the per-expert outer defect (issue 7) ----------------------------------------------
