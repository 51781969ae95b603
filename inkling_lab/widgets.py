"""ipywidgets explorers: thin ``interact``-style fronts over pure, seeded functions of
the library. Each returns the widget; the function it drives is tested on its own."""
from __future__ import annotations

# -- core (issue 2): the error lab -----------------------------------------------------

# -- adapters (issue 3) -------------------------------------------------------------------

# -- forward and profiling (issue 4) ----------------------------------------------------

# -- tensor parallelism (issue 5) -------------------------------------------------------

# -- the per-expert outer defect (issue 7) ----------------------------------------------
