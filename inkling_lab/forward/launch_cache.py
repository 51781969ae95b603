"""The Triton backend's repeat-launch path: a compiled kernel called through its own
launcher, skipping Triton's per-call argument binding (``triton_backend`` uses it for
every launch).

Triton's launch binds and specializes every argument on every call (15-40 µs of host
time per launch on the H200 machine's CPU, ``data/profiles/h200_graph.json``). The first
call of a configuration goes through it and compiles; later calls whose arguments
specialize the same way call the compiled kernel's launcher directly, as Triton's own
launch does after binding. Under the interpreter, or if this Triton's internals differ,
every call takes the plain path.
"""
from __future__ import annotations

_FAST: dict[tuple, tuple] = {}
_FAST_OK = [True]
_CACHE_SIZE = 512


def run(kern, grid: tuple, args: tuple, fast: tuple | None = None, **meta) -> None:
    """``kern[grid](*args, **meta)`` with less host work on repeat calls.

    ``fast = (plan's cache, key)``: the key names what can change between calls on one
    plan (the caller's tensors' dtype and 16-byte alignment, the shapes), the plan fixes
    the rest (its own tensors, the token count); without it the key is every argument's
    specialization (slower to build)."""
    key = None
    if _FAST_OK[0]:
        if fast is not None:
            cache, key = fast[0], (kern, meta.get("HAS_LORA"), fast[1])
        else:
            cache, key = _FAST, (kern, tuple(meta.items()), tuple(
                a if type(a) in (int, float) else (a.dtype, a.device.index, a.data_ptr() % 16 == 0) for a in args))
        hit = cache.get(key)
        if hit is not None:
            ck, tail, driver, knobs = hit
            full = args + tail
            try:
                stream = driver.active.get_current_stream(driver.active.get_current_device())
                ck.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream,
                       ck.function, ck.packed_metadata, ck.launch_metadata(grid, stream, *full),
                       knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *full)
                return
            except (AttributeError, TypeError):  # another Triton: use its own launch from now on
                _FAST_OK[0] = False
                _FAST.clear()
    ck = kern[grid](*args, **meta)
    if key is None or ck is None or not hasattr(ck, "function"):
        return
    try:
        from triton import knobs
        from triton.runtime import driver

        names = kern.arg_names
        defaults = {p.name: p.default for p in kern.params}
        tail = tuple(meta[n] if n in meta else defaults[n] for n in names[len(args):])
        if len(cache) > _CACHE_SIZE:
            cache.clear()
        cache[key] = (ck, tail, driver, knobs)
    except (AttributeError, ImportError, KeyError):
        _FAST_OK[0] = False
