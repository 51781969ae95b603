"""What the kit promises about files and its command line (issue 14), by promise:
state kept, clear errors, bounded time and memory, safe output."""
import errno
import json
import os
import re
import resource
import signal
import stat
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save as save_bytes
from safetensors.torch import save_file

from inkling_lab.adapters import (CONFIG_FILE, WEIGHTS_FILE, Adapter, load_adapter, save_adapter,
                                  synthetic_adapter)
from inkling_lab.atomic import atomic_write, atomic_writer
from inkling_lab.cli import main, printable
from inkling_lab.convert import convert, convert_to_file, load_pool
from inkling_lab.errors import expect_error
from in_process import run_cli

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = "\x1b]0;owned\x07\x1b[2J"


def _adapter_folder(tmp_path, name="ad", **kw):
    return save_adapter(synthetic_adapter(2, 8, 6, 2, **kw), tmp_path / name)


# -- state kept ------------------------------------------------------------------------

def test_of_two_writers_racing_for_one_new_name_one_wins_and_the_other_is_told(tmp_path):
    out = tmp_path / "pool.safetensors"
    with pytest.raises(FileExistsError, match="refusing to write pool.safetensors: it already exists") as caught:
        with atomic_writer(out, exclusive=True) as f:
            f.write(b"loser")
            out.write_bytes(b"winner")  # the other writer takes the name while this one writes
    assert out.read_bytes() == b"winner" and f"output path: {out}" in caught.value.__notes__
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pool.safetensors"]  # no temporary left


def test_convert_without_force_never_replaces_what_appeared_meanwhile(tmp_path, monkeypatch):
    folder = _adapter_folder(tmp_path)
    out = tmp_path / "pool.safetensors"
    import inkling_lab.convert as conv

    real = conv._write_pool

    def racing(path, *a):
        path.write_bytes(b"the other run's pool")  # after the early check, before the write
        return real(path, *a)

    monkeypatch.setattr(conv, "_write_pool", racing)
    with expect_error("ISL-K213", show=False):
        convert_to_file([load_adapter(folder)], out, 2)
    assert out.read_bytes() == b"the other run's pool"


def test_two_convert_runs_to_one_new_output_one_wins(tmp_path):
    """The issue's reproduction: both used to exit 0, the second replacing the first."""
    folder = _adapter_folder(tmp_path)
    out = tmp_path / "pool.safetensors"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runs = [subprocess.Popen([sys.executable, "-m", "inkling_lab.cli", "convert", str(folder), "-n", "2", "-o",
                              str(out), "-q"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for _ in range(2)]
    results = [(run.wait(timeout=600), run.stderr.read()) for run in runs]
    assert sorted(code for code, _ in results) == [0, 1]
    assert b"refusing to write pool.safetensors: it already exists" in next(err for code, err in results if code)
    assert load_pool(out).lora_ranks == [2] and sorted(p.name for p in tmp_path.iterdir()) == ["ad", "pool.safetensors"]


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_new_files_honour_the_umask_and_replaced_ones_keep_their_mode(tmp_path, umask):
    old = os.umask(umask)
    try:
        path = atomic_write(tmp_path / "new.bin", b"x")
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
        kept = tmp_path / "kept.bin"
        kept.write_bytes(b"old")
        kept.chmod(0o640)
        atomic_write(kept, b"new")
        assert stat.S_IMODE(kept.stat().st_mode) == 0o640 and kept.read_bytes() == b"new"
    finally:
        os.umask(old)


def test_the_folder_is_fsynced_after_the_rename(tmp_path, monkeypatch):
    synced = []
    real = os.fsync

    def fsync(fd):
        synced.append((stat.S_ISDIR(os.fstat(fd).st_mode), os.path.exists(tmp_path / "f.bin")))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    atomic_write(tmp_path / "f.bin", b"data")
    assert synced == [(False, False), (True, True)]  # the file's data, then the folder, once renamed


def test_a_killed_write_leaves_a_temporary_that_the_next_write_removes(tmp_path):
    out = tmp_path / "pool.safetensors"
    writer = os.fork()  # a process of its own, killed mid-write (forked: it touches no torch, imports nothing)
    if writer == 0:
        try:
            with atomic_writer(out) as f:
                f.write(b"half")
                f.flush()
                os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(1)  # never back into pytest, whatever happened
    _, status = os.waitpid(writer, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".pool.safetensors.") and not out.exists()
    busy = tmp_path / f".pool.safetensors.{os.getpid()}-00.tmp"  # a live writer's: never touched
    busy.write_bytes(b"")
    # the next write, a new process as the next `inkling-lab convert` is, cleans up
    done = subprocess.run([sys.executable, "-c", f"from inkling_lab.atomic import atomic_write\n"
                           f"atomic_write({str(out)!r}, b'whole')"],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert done.returncode == 0 and out.read_bytes() == b"whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([busy.name, "pool.safetensors"])


# -- clear errors ------------------------------------------------------------------------

def test_a_deeply_nested_config_is_a_clear_error(tmp_path):
    folder = _adapter_folder(tmp_path)
    (folder / CONFIG_FILE).write_text("[" * 100_000 + "]" * 100_000)
    with expect_error("ISL-K202", show=False) as caught:
        load_adapter(folder)
    assert "nested too deeply" in str(caught.exception)
    result = run_cli("doctor", str(folder), "-n", "2", "--hidden", "8", "--intermediate", "6")
    assert result.returncode == 1 and b"Traceback" not in result.stderr  # a report (sglang's json.load does recurse)
    assert b"nested too deeply" in result.stdout


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_a_full_disk_or_read_only_folder_names_the_file_and_keeps_the_old_one(tmp_path, error):
    out = atomic_write(tmp_path / "pool.safetensors", b"old")
    with pytest.raises(OSError, match="could not write pool.safetensors") as caught:
        with atomic_writer(out) as f:
            f.write(b"new")
            raise OSError(error, os.strerror(error))  # what write() or fsync() raise there
    assert caught.value.errno == error and caught.value.filename == str(out)
    assert out.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["pool.safetensors"]


def test_an_unwritable_output_folder_is_refused_by_the_cli_with_the_name(tmp_path, monkeypatch, capsys):
    folder = _adapter_folder(tmp_path)
    real = os.open

    def refuse(path, flags, *a, **kw):
        if str(path).endswith(".tmp"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real(path, flags, *a, **kw)

    monkeypatch.setattr(os, "open", refuse)
    assert main(["convert", str(folder), "-n", "2", "-o", str(tmp_path / "out.safetensors"), "-q"]) == 1
    err = capsys.readouterr().err
    assert "could not write out.safetensors" in err and "Traceback" not in err


def test_load_pool_of_anything_but_a_pool_names_the_file(tmp_path):
    folder = _adapter_folder(tmp_path)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00" * 100)
    pool_file = convert([load_adapter(folder)], 2).save(tmp_path / "pool.safetensors")
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(pool_file.read_bytes()[:-8])
    for path in (folder / WEIGHTS_FILE, junk, cut):
        with expect_error("ISL-K403", show=False) as caught:
            load_pool(path)
        assert str(caught.exception).startswith(path.name)


# -- bounded reads and memory --------------------------------------------------------------
# What these check is the work done, not how long it took: bytes read through read(2), and
# address space a call may map (a busy machine can be slow; it cannot read less).

def _bytes_read() -> int:
    """Bytes this process has read through read(2) so far (Linux's ``/proc/self/io``)."""
    return int(re.search(r"^rchar: (\d+)$", Path("/proc/self/io").read_text(), flags=re.M).group(1))


@contextmanager
def _address_space_capped(extra: int = 8 << 30):
    """Inside, the process can map at most ``extra`` bytes more than it has: a buffer of a
    mistyped size (terabytes) fails at once, whatever the machine's overcommit policy."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    mapped = int(re.search(r"^VmSize:\s+(\d+) kB$", Path("/proc/self/status").read_text(), flags=re.M).group(1)) << 10
    cap = mapped + extra if hard == resource.RLIM_INFINITY else min(mapped + extra, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_a_huge_sparse_weights_file_is_refused_before_it_is_read(tmp_path):
    folder = _adapter_folder(tmp_path)
    with open(folder / WEIGHTS_FILE, "r+b") as f:
        f.truncate(64 * 2 ** 30)  # 64 GiB, sparse: the header no longer matches the size
    before = _bytes_read()
    with expect_error("ISL-K204", show=False):
        load_adapter(folder)
    assert _bytes_read() - before < 2 ** 26  # the header, never the 64 GiB (nor their sha256)


def test_only_the_shared_sink_tensors_are_read(tmp_path):
    ad = synthetic_adapter(2, 8, 6, 2)
    other = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(2, 8)}
    folder = save_adapter(ad, tmp_path / "ad")
    save_file({**ad.weights, **other}, folder / WEIGHTS_FILE)
    loaded = load_adapter(folder)
    assert loaded.other_keys == list(other) and not set(other) & set(loaded.weights)
    assert any(f.code == "ISL-N202" for f in loaded.findings)


def test_a_mistyped_hidden_size_allocates_nothing(tmp_path):
    folder = _adapter_folder(tmp_path)
    adapter = load_adapter(folder)
    with _address_space_capped(), expect_error("ISL-E016", show=False):  # upstream's shape assertion,
        convert([adapter], 2, hidden=10 ** 6)                               # checked on the meta device
    with _address_space_capped(), expect_error("ISL-K164", show=False) as caught:  # a pool past the bound,
        convert([adapter], 2, hidden=10 ** 9)                                       # not "can't allocate 4 TB"
    assert "adapter 'ad' has H=8, F=6" in str(caught.exception)
    with expect_error("ISL-K162", show=False) as caught:  # past any model: refused with the adapter's sizes
        convert([adapter], 2, hidden=10 ** 12)
    assert "adapter 'ad' has H=8, F=6" in str(caught.exception)


def test_doctor_with_a_mistyped_hidden_size_answers_at_once(tmp_path, capsys):
    folder = _adapter_folder(tmp_path)
    with _address_space_capped():
        assert main(["doctor", str(folder), "-n", "2", "--hidden", "1000000000000", "--intermediate", "6"]) == 1
    out = capsys.readouterr().out
    assert "ISL-K162" in out and "has H=8, F=6" in out and "cannot allocate" not in out  # no allocator failure


# -- safe output ------------------------------------------------------------------------------

def test_names_from_files_never_reach_the_terminal_raw(tmp_path, capsys):
    ad = synthetic_adapter(2, 8, 6, 2)
    weights = {k.replace("layers.0", f"layers.0{HOSTILE}"): v for k, v in ad.weights.items()}
    folder = save_adapter(Adapter.from_state(ad.config, weights), tmp_path / f"ad{HOSTILE}")
    assert main(["convert", str(folder), "-n", "2", "-o", str(tmp_path / "p.safetensors"), "-q"]) == 0
    main(["doctor", str(folder), "-n", "2", "--hidden", "8", "--intermediate", "6"])
    main(["convert", str(folder), "-n", "2", "-o", str(tmp_path / "p.safetensors")])  # refused: exists
    captured = capsys.readouterr()
    for text in (captured.out, captured.err):
        assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b]0;owned\\x07" in captured.out


def test_printable_escapes_controls_and_undecodable_bytes_and_keeps_the_rest():
    assert printable(f"a{HOSTILE}\tb\nc") == "a\\x1b]0;owned\\x07\\x1b[2J\tb\nc"
    assert printable("name\udcff") == "name\\xff"  # a non-UTF-8 byte of a file name
    assert printable("\u202egnp.exe") == "\\u202egnp.exe"  # a bidirectional override
    assert printable("é…", "ascii") == "\\xe9\\u2026" and printable("é…") == "é…"


@pytest.mark.skipif(sys.platform != "linux", reason="non-UTF-8 file names: a Linux filesystem")
def test_a_non_utf8_folder_and_output_name_with_a_strict_ascii_stdout(tmp_path):
    folder = Path(os.fsdecode(bytes(tmp_path) + b"/ad\xff\xfe"))
    _adapter_folder(tmp_path, name=folder.name)
    out = Path(os.fsdecode(bytes(tmp_path) + b"/pool\xff.safetensors"))
    result = run_cli("convert", str(folder), "-n", "2", "-o", str(out), "-q", env={"PYTHONIOENCODING": "ascii:strict"})
    assert result.returncode == 0, result.stderr
    assert out.exists() and b"\\xff" in result.stdout and b"Traceback" not in result.stderr


def test_output_piped_to_head_ends_quietly():
    proc = subprocess.Popen([sys.executable, "-c", (
        "import sys\nfrom inkling_lab.cli import main\n"
        "sys.exit(main(['explain', 'ISL-E001']) or main(['explain', 'ISL-E001']))")],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()  # what `head -1` does after its line
    _, err = proc.communicate(timeout=600)
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err


# -- only documented exceptions --------------------------------------------------------------

JSON = st.recursive(st.none() | st.booleans() | st.integers(-5, 70) | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)
CONFIG = st.fixed_dictionaries({}, optional={"r": JSON | st.integers(1, 4), "lora_alpha": JSON, "peft_type": JSON,
                                             "target_parameters": JSON, "target_modules": JSON}) | JSON
KEYS = st.sampled_from([
    "base_model.model.model.layers.0.mlp.shared_experts.gate_proj.lora_A.weight",
    "base_model.model.model.layers.0.mlp.shared_experts.gate_proj.lora_B.weight",
    "base_model.model.model.layers.0.mlp.shared_experts.down_proj.lora_A.weight",
    "base_model.model.model.layers.0.mlp.shared_experts.0.up_proj.lora_B.weight",
    "base_model.model.model.layers.0.mlp.shared_experts.lora_A.weight",
    "base_model.model.model.layers.0.mlp.shared_experts.base_layer.lora_B.weight",
    "base_model.model.model.layers.0.mlp.shared_experts.router.weight",
    "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"])
TENSORS = st.dictionaries(KEYS, st.tuples(st.lists(st.integers(0, 5), max_size=3),
                                          st.sampled_from([torch.float32, torch.bfloat16, torch.int8])), max_size=6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(config=CONFIG, raw=st.binary(max_size=64) | st.none(), tensors=TENSORS, text_config=st.booleans())
def test_load_adapter_raises_only_documented_errors(tmp_path, config, raw, tensors, text_config):
    folder = tmp_path / "fuzz"
    folder.mkdir(exist_ok=True)
    (folder / CONFIG_FILE).write_text(json.dumps(config) if text_config or raw is None else "{\"r\": ")
    if raw is not None:
        data = raw
    else:
        data = save_bytes({k: torch.zeros(shape, dtype=dtype) for k, (shape, dtype) in tensors.items()})
    (folder / WEIGHTS_FILE).write_bytes(data)
    try:
        adapter = load_adapter(folder)
    except (ValueError, FileNotFoundError) as exc:  # load_adapter's documented refusals
        assert str(exc).startswith("fuzz/"), exc  # each names the file
    else:
        assert adapter.factor_keys


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=64) | st.none(), meta=st.dictionaries(
    st.sampled_from(["format", "geometry", "tensor_parallel", "slots", "modules"]), JSON.map(json.dumps), max_size=5))
def test_load_pool_raises_only_its_documented_error(tmp_path, raw, meta):
    path = tmp_path / "fuzz.safetensors"
    if raw is None:
        meta = {**meta, "format": "inkling-lab shared-sink pool v1"} if len(meta) % 2 else meta
        raw = save_bytes({"m.gate_up_a": torch.zeros(1, 1, 2, 2)}, metadata=meta)
    path.write_bytes(raw)
    try:
        load_pool(path)
    except ValueError as exc:
        assert str(exc).startswith("fuzz.safetensors: not an inkling-lab pool file"), exc


def test_a_pasted_log_that_is_not_utf8_is_read_and_its_bytes_printed_escaped():
    result = run_cli("explain", "-", input=b"ValueError: Inkling shared-sink LoRA requires four 4D MoE buffers \xff\x1b[2J\n")
    assert result.returncode == 0 and b"ISL-E001" in result.stdout
    assert b"Traceback" not in result.stderr and b"\x1b" not in result.stdout + result.stderr


# -- issue 22: only regular files are opened, shards stay inside, nothing read twice ----------------

import signal  # noqa: E402
import socket  # noqa: E402
from contextlib import contextmanager  # noqa: E402

from inkling_lab.doctor import doctor  # noqa: E402
from inkling_lab.transformers_interop import INDEX_FILE, sink_from_checkpoint  # noqa: E402

SINK = "model.layers.0.mlp.shared_experts."


@contextmanager
def _no_hang(seconds: int = 120):
    """A guard, not a measurement: a blocking open of a FIFO would wait forever; this turns
    that into a failure instead of a stuck test run."""
    def stuck(*_):
        raise AssertionError("blocked (a FIFO opened for reading?)")

    old = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _special(path: Path, kind: str, tmp_path: Path) -> None:
    """Put a FIFO, a socket, a folder, a character device or a symlink to a FIFO at ``path``."""
    if path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink to a fifo":
        os.mkfifo(tmp_path / "pipe")
        os.symlink(tmp_path / "pipe", path)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()
    elif kind == "folder":
        path.mkdir()
    else:  # a character device made here (root only): never the machine's /dev/null
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))


KINDS = ["fifo", "symlink to a fifo", "socket", "folder"] + (["device"] if os.geteuid() == 0 else [])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", [WEIGHTS_FILE, CONFIG_FILE])
def test_no_hang_an_adapter_file_that_is_no_regular_file_is_refused_unopened(tmp_path, name, kind, capsys):
    folder = _adapter_folder(tmp_path)
    _special(folder / name, kind, tmp_path)
    with _no_hang():
        with expect_error("ISL-K232", show=False):
            load_adapter(folder)
        report = doctor(folder, 2, 8, 6)
        assert report.kit.outcome == "refuses" and report.load.outcome == "unknown"
        assert main(["convert", str(folder), "-n", "2", "-o", str(tmp_path / "p.safetensors"), "-q"]) == 1
    assert "ISL-K232" in capsys.readouterr().err and not (tmp_path / "p.safetensors").exists()


def _checkpoint(folder: Path, shards: dict[str, dict[str, torch.Tensor]]) -> None:
    folder.mkdir(exist_ok=True)
    for name, tensors in shards.items():
        save_file(tensors, folder / name)


def _sink_state(seed: int, dtype=torch.float32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {SINK + "gate_proj": torch.randn(2, 6, 8, generator=g).to(dtype),
            SINK + "up_proj": torch.randn(2, 6, 8, generator=g).to(dtype),
            SINK + "down_proj": torch.randn(2, 8, 6, generator=g).to(dtype)}


ENTRY = st.sampled_from(["good", "climbs out", "absolute", "not a string", "fifo", "missing"])


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.lists(ENTRY, min_size=3, max_size=3), json_twice=st.booleans(), shard_twice=st.booleans())
def test_no_silent_read_a_sharded_index_is_read_as_saved_or_refused_by_its_fault(tmp_path_factory, entries,
                                                                                 json_twice, shard_twice):
    folder = tmp_path_factory.mktemp("ck")
    state = _sink_state(0)
    keys = list(state)
    _checkpoint(folder, {f"s{i}.safetensors": {k: state[k]} for i, k in enumerate(keys)})
    if shard_twice:  # the gate again, other values, in another shard: which one is meant?
        save_file({keys[0]: state[keys[0]] + 1, "other": torch.zeros(1)}, folder / "dup.safetensors")
    os.mkfifo(folder / "pipe.safetensors")
    names = {"good": None, "climbs out": "../s{i}.safetensors", "absolute": str(folder) + "/s{i}.safetensors",
             "not a string": 7, "fifo": "pipe.safetensors", "missing": "gone.safetensors"}
    pairs = [(k, f"s{i}.safetensors" if e == "good" else names[e] if not isinstance(names[e], str)
              else names[e].format(i=i)) for i, (k, e) in enumerate(zip(keys, entries))]
    if shard_twice:
        pairs.append(("other", "dup.safetensors"))
    if json_twice:
        pairs.append((keys[1], pairs[1][1]))
    (folder / INDEX_FILE).write_text("{\"weight_map\": {" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}"
                                                                       for k, v in pairs) + "}}")
    faults = {"ISL-K420" for e in entries if e in ("climbs out", "absolute", "not a string")}
    faults |= {"ISL-K421"} if json_twice or shard_twice else set()
    faults |= {"ISL-K232"} if "fifo" in entries else set()
    faults |= {"FileNotFoundError"} if "missing" in entries else set()
    with _no_hang():
        try:
            sink = sink_from_checkpoint(folder)
        except (ValueError, TypeError, FileNotFoundError) as exc:
            from inkling_lab.errors import find_entry

            entry = find_entry(exc)
            got = entry.code if entry is not None else type(exc).__name__
            assert got in faults, (got, faults, exc)
        else:
            assert not faults
            assert torch.equal(sink.w2, state[keys[2]])  # read as saved, nothing else


@settings(max_examples=80, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dtypes=st.lists(st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32,
                                         torch.bool, torch.uint8]), min_size=3, max_size=3),
       cast=st.sampled_from([None, torch.float32, torch.float64]))
def test_no_silent_cast_a_checkpoint_sink_is_one_float_dtype_or_refused(tmp_path_factory, dtypes, cast):
    folder = tmp_path_factory.mktemp("ck")
    state = {k: v.to(d) for (k, v), d in zip(_sink_state(1).items(), dtypes)}
    _checkpoint(folder, {"model.safetensors": state})
    floats = all(d.is_floating_point for d in dtypes)
    if not floats or (cast is None and len(set(dtypes)) > 1):
        with expect_error("ISL-K422", show=False):
            sink_from_checkpoint(folder, dtype=cast)
        return
    sink = sink_from_checkpoint(folder, dtype=cast)
    assert sink.dtype == (cast or dtypes[0]) and torch.equal(sink.w2, state[SINK + "down_proj"].to(sink.dtype))


@pytest.mark.parametrize("declared", [60 * 2 ** 30, 2 ** 63, 200_000_000, 9])
def test_bounded_a_header_that_declares_more_than_the_file_is_refused_before_any_allocation(tmp_path, declared):
    folder = _adapter_folder(tmp_path)
    with open(folder / WEIGHTS_FILE, "r+b") as f:
        f.write(declared.to_bytes(8, "little"))
        f.truncate(64 * 2 ** 30)  # sparse
    with _address_space_capped(2 << 30), expect_error("ISL-K204", show=False):
        load_adapter(folder)


def test_no_silent_drop_one_module_saved_two_ways_is_refused(tmp_path):
    from safetensors.torch import load_file

    ad = synthetic_adapter(2, 8, 6, 2, per_expert=True)
    folder = save_adapter(ad, tmp_path / "peft", target_parameters=True)
    classic = "base_model.model.model.layers.0.mlp.shared_experts.0.gate_proj.lora_A.weight"
    save_file({**load_file(folder / WEIGHTS_FILE), classic: ad.weights[classic] + 1}, folder / WEIGHTS_FILE)
    with expect_error("ISL-K233", show=False):
        load_adapter(folder)


# -- issue 22: the writer replaces only a regular file, and cleans up after itself ---------------------

from inkling_lab.atomic import check_target  # noqa: E402

TARGETS = ["fifo", "socket", "folder", "symlink to a file", "symlink to a fifo", "dangling symlink"] + (
    ["device"] if os.geteuid() == 0 else [])


def _target(path: Path, kind: str, tmp_path: Path) -> None:
    if kind == "symlink to a file":
        (tmp_path / "kept").write_bytes(b"the link's target")
        os.symlink(tmp_path / "kept", path)
    elif kind == "dangling symlink":
        os.symlink(tmp_path / "nowhere", path)
    else:
        _special(path, kind, tmp_path)


def _what(path: Path) -> tuple:
    st = os.lstat(path)
    return stat.S_IFMT(st.st_mode), st.st_ino, (os.readlink(path) if stat.S_ISLNK(st.st_mode) else None)


@pytest.mark.parametrize("force", [True, False])
@pytest.mark.parametrize("kind", TARGETS)
def test_safe_output_force_never_replaces_anything_but_a_regular_file(tmp_path, kind, force, capsys):
    folder = _adapter_folder(tmp_path)
    out = tmp_path / "out.safetensors"
    _target(out, kind, tmp_path)
    before = _what(out)
    with _no_hang():
        args = ["convert", str(folder), "-n", "2", "-o", str(out), "-q"] + (["--force"] if force else [])
        assert main(args) == 1
        for write in (lambda: atomic_write(out, b"x"), lambda: atomic_write(out, b"x", exclusive=True)):
            with expect_error("ISL-K213", show=False):
                write()
    assert _what(out) == before  # the same node, untouched (a symlink still points where it did)
    if kind == "symlink to a file":
        assert (tmp_path / "kept").read_bytes() == b"the link's target"
    assert "ISL-K213" in capsys.readouterr().err
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_safe_output_the_machines_dev_null_is_refused_like_a_device_made_here(tmp_path):
    if os.geteuid() == 0:
        os.mknod(tmp_path / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        with expect_error("ISL-K213", show=False):
            check_target(tmp_path / "null", force=True)
        assert stat.S_ISCHR(os.lstat(tmp_path / "null").st_mode)
    # proven on a device of our own; the check only looks at /dev/null, it writes nothing
    with expect_error("ISL-K213", show=False) as caught:
        check_target("/dev/null", force=True)
    assert "character device" in str(caught.exception) and stat.S_ISCHR(os.lstat("/dev/null").st_mode)


@pytest.mark.parametrize("output, why", [("", "the output path is empty"), ("afile/pool.safetensors",
                                          "its folder"), ("afile/deeper/pool.safetensors", "its folder"),
                                         ("sub/", "names a folder")])
def test_clear_error_an_output_path_that_cannot_be_a_file_says_why(tmp_path, output, why, capsys):
    folder = _adapter_folder(tmp_path)
    (tmp_path / "afile").write_bytes(b"x")
    target = output if not output else str(tmp_path / output) + ("/" if output.endswith("/") else "")
    assert main(["convert", str(folder), "-n", "2", "-o", target, "-q"]) == 1
    err = capsys.readouterr().err
    assert why in err and "ISL-K213" in err and "Errno" not in err


def test_state_kept_a_convert_that_fails_while_writing_removes_the_folders_it_made(tmp_path):
    ad = synthetic_adapter(2, 8, 6, 2, dtype=torch.float16)
    big = {k: (torch.full_like(v, 40000.0) if k.endswith("lora_B.weight") else v) for k, v in ad.weights.items()}
    folder = save_adapter(Adapter.from_state({**ad.config, "lora_alpha": 4.0}, big), tmp_path / "ad")
    (tmp_path / "existing").mkdir()
    out = tmp_path / "existing" / "new" / "deeper" / "pool.safetensors"
    with expect_error("ISL-K160", show=False):  # the overflow is found while the module is built and written
        convert_to_file([load_adapter(folder)], out, 2)
    assert sorted(p.name for p in (tmp_path / "existing").iterdir()) == []  # new/deeper made, then removed


# -- issue 22: sizes, JSON and zero-size factors -------------------------------------------------------

import math  # noqa: E402

from inkling_lab.compare import compare  # noqa: E402
from inkling_lab.records import json_ready  # noqa: E402


@pytest.mark.parametrize("extra", [["--hidden", str(10 ** 12), "--intermediate", "6"],
                                   ["--hidden", "8", "--intermediate", "6", "--tokens", str(10 ** 10)],
                                   ["--hidden", str(2 ** 20), "--intermediate", str(2 ** 20)]])
def test_bounded_compare_refuses_sizes_past_its_batch_naming_the_adapters_sizes(tmp_path, extra, capsys):
    folder = _adapter_folder(tmp_path)
    with _address_space_capped(1 << 30):  # nothing of that size is even tried
        assert main(["compare", str(folder), "-n", "2", *extra]) == 1
    err = capsys.readouterr().err
    assert "ISL-K163" in err and "'ad' has H=8, F=6" in err and "Traceback" not in err


@pytest.mark.parametrize("seed", [2 ** 70, -2 ** 70, 1.5, True])
def test_clear_error_a_seed_torch_cannot_take_is_named(tmp_path, seed):
    with pytest.raises((ValueError, TypeError), match="compare: seed must be"):
        compare([_adapter_folder(tmp_path)], 2, 8, 6, seed=seed)


JSONISH = st.recursive(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(), st.text(max_size=3),
                                 st.none(), st.booleans()),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                    max_size=3), max_leaves=12)


@given(JSONISH)
def test_safe_output_json_ready_is_strict_json_and_says_what_each_null_was(value):
    ready = json_ready(value)
    text = json.dumps(ready, allow_nan=False)  # no bare NaN: a strict reader takes it
    assert json.loads(text) == ready
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, float) and not math.isfinite(v):
                assert ready[k] is None and ready[f"{k}_not_finite"] == repr(v)


def test_safe_output_compare_json_of_a_nan_adapter_is_valid_json(tmp_path, capsys):
    folder = _adapter_folder(tmp_path)
    config = json.loads((folder / CONFIG_FILE).read_text())
    (folder / CONFIG_FILE).write_text(json.dumps({**config, "lora_alpha": float("nan")}))
    main(["compare", str(folder), "-n", "2", "--hidden", "8", "--intermediate", "6", "--json"])
    report = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"bare {c} in --json"))
    rows = [r for r in report["rows"] if r["max_abs"] is None]
    assert rows and all(r["max_abs_not_finite"] == "nan" for r in rows)


@pytest.mark.parametrize("factor", ["gate_proj.lora_A", "down_proj.lora_A", "down_proj.lora_B", "gate_proj.lora_B"])
def test_clear_error_a_zero_size_factor_is_named(factor):
    ad = synthetic_adapter(2, 8, 6, 2)
    key = next(k for k in ad.weights if factor in k)
    t = ad.weights[key]
    empty = t[:, :0] if factor.endswith("A") else t[:0]
    with expect_error("ISL-K234", show=False) as caught:
        Adapter.from_state(ad.config, {**ad.weights, key: empty})
    assert key in str(caught.exception)
