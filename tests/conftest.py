"""Shared fixtures of the library's tests: seeded scenarios (a sink with a loaded pool,
tokens and their batch) built by the one factory, ``inkling_lab.Scenario.random``."""
from __future__ import annotations

import os
import sys

import pytest
import torch

from interpreted import import_triton_for_the_interpreter

import_triton_for_the_interpreter()  # before PEFT imports it compiled (interpreted.py says why)

from inkling_lab.geometry import PRESETS, Geometry
from inkling_lab.scenario import Scenario


def make_scenario(geometry: Geometry | str = "toy", **kwargs) -> Scenario:
    """``Scenario.random`` of a geometry or preset name, in float64 unless told otherwise
    (the forward tests compare against the float64 reference at ~1e-12)."""
    g = PRESETS[geometry] if isinstance(geometry, str) else geometry
    kwargs.setdefault("dtype", torch.float64)
    return Scenario.random(g, **kwargs)


@pytest.fixture
def scenario():
    """The factory: ``scenario(geometry_or_preset, tokens=..., seed=..., ...) -> Scenario``."""
    return make_scenario


@pytest.fixture
def toy(scenario) -> Scenario:
    """The toy preset (n 2, H 8, F 6, R 2, S 3, shared outer), 9 tokens over every slot
    and base-only ones, float64."""
    return scenario("toy", tokens=9, seed=3, token_slots=[0, 0, 2, -1, 1, 1, 2, 0, -1])
