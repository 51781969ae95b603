"""Issue 22, part 2: the kit under hostile input, by promise (no silent wrong result, no
hang, a clear error naming the argument, file or tensor, nothing written outside the
intended output, a failed call leaves objects as they were)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import inkling_lab as il
from inkling_lab.cli import main
from inkling_lab.errors import expect_error, find_entry
from inkling_lab.geometry import SIZE_LIMIT
from in_process import forked_cli, run_cli

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "data" / "adapters"
TOY = ["-n", "2", "--hidden", "8", "--intermediate", "6"]
HANG_GUARD = 300  # seconds: a generous bound on a process that must end, never a timing assertion


def _cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "inkling_lab.cli", *argv], capture_output=True, env=environ,
                          stdin=subprocess.DEVNULL, timeout=HANG_GUARD)


# -- sizes that multiply past any model: bounded before anything is allocated (ISL-K164) ------------------------

@pytest.mark.parametrize("max_rank", [2 ** 27, 2 ** 30, SIZE_LIMIT])
def test_doctor_huge_max_rank_the_three_verdicts_agree_and_nothing_is_allocated(capsys, monkeypatch, max_rank):
    import inkling_lab.geometry as geometry

    def no_allocation(*args, **kwargs):  # a pool of this rank must never reach the allocator
        raise AssertionError(f"allocate{args[:2]} called")

    monkeypatch.setattr(geometry.torch, "zeros", no_allocation)
    code = main(["doctor", str(SAMPLES / "rank8"), *TOY, "--max-rank", str(max_rank), "--json"])
    report = json.loads(capsys.readouterr().out)
    # the kit refuses the pool by its size, sglang's verdict says what its init_buffers would do: never "loads"
    assert report["kit"]["outcome"] == "refuses" and report["kit"]["code"] == "ISL-K164"
    assert "adapter 'rank8' has H=8, F=6" in report["kit"]["text"] and "r=8" in report["kit"]["text"]
    load = report["sglang"]["load"]
    assert load["outcome"] == "unknown" and "LoRAMemoryPool.init_buffers" in load["why"]
    assert f"--max-lora-rank {max_rank}" in load["why"]
    assert report["sglang"]["computes"]["outcome"] == "unknown"
    assert code == report["exit_status"] == 1


def test_doctor_max_rank_within_the_bound_loads_and_writes(capsys):
    code = main(["doctor", str(SAMPLES / "rank8"), *TOY, "--max-rank", "64", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert (report["sglang"]["load"]["outcome"], report["kit"]["outcome"], code) == ("loads", "writes", 0)


@settings(max_examples=40)
@given(value=st.one_of(st.integers(max_value=-1), st.booleans(), st.floats(allow_nan=True), st.text(max_size=3),
                       st.integers(min_value=SIZE_LIMIT + 1, max_value=2 ** 80)),
       what=st.sampled_from(["n_shared_experts", "hidden", "intermediate", "max_rank", "tp"]))
def test_doctor_a_bad_size_is_refused_by_name_and_one_past_any_model_never_loads(value, what):
    sizes = {"n_shared_experts": 2, "hidden": 8, "intermediate": 6, "max_rank": None, "tp": 1, what: value}
    args = sizes.pop("n_shared_experts"), sizes.pop("hidden"), sizes.pop("intermediate")
    if isinstance(value, int) and not isinstance(value, bool) and value > SIZE_LIMIT and what not in (
            "n_shared_experts", "tp"):
        report = il.doctor(SAMPLES / "rank8", *args, **sizes, measure=False)  # the adapter's sizes in the refusal
        assert report.kit.outcome == "refuses" and report.load.outcome != "loads" and report.exit_status == 1
        return
    with pytest.raises((TypeError, ValueError), match=f"doctor: {what}"):
        il.doctor(SAMPLES / "rank8", *args, **sizes, measure=False)


@settings(max_examples=60)
@given(slots=st.integers(1, SIZE_LIMIT), rank=st.integers(0, SIZE_LIMIT), hidden=st.integers(1, SIZE_LIMIT))
@example(slots=2653, rank=16864, hidden=1)  # only w1_delta past the bound (a fresh-clone run found it)
def test_a_pool_past_the_bound_is_refused_from_its_sizes_alone(slots, rank, hidden):
    g_sizes = dict(n=2, hidden=hidden, intermediate=6, slots=slots, max_rank=rank)
    # n 2, F 6: the four buffers [S, 1, 2R, H], [S, 2, 12, R], [S, 2, R, 6], [S, 1, H, R], the weights
    # [2, 12, H] and [2, H, 6], and the derived operands w1_delta [S, 24, 2R] and a_cat [S, R, 12]
    largest = max(slots * 2 * rank * hidden, slots * 24 * rank, slots * rank * hidden, 24 * hidden,
                  slots * 24 * 2 * rank, slots * rank * 12)
    if largest <= SIZE_LIMIT:
        geometry = il.Geometry(**g_sizes)
        assert max(torch.Size(s).numel() for s in geometry.buffer_shapes().values()) <= SIZE_LIMIT
    else:
        with expect_error("ISL-K164", show=False):
            il.LoRAPool(**g_sizes)


def test_compare_takes_no_pool_flags_it_would_ignore(capsys):
    for flag in (["--tp", "2"], ["--max-rank", "64"]):
        with pytest.raises(SystemExit) as exit_:
            main(["compare", str(SAMPLES / "rank8"), *TOY, *flag])
        assert exit_.value.code == 2 and flag[0] in capsys.readouterr().err


# -- a second pool of another dtype: the kept derived operands are named (ISL-K165) -----------------------------

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


@settings(max_examples=30)
@given(sink_dtype=st.sampled_from(FLOATS), first=st.sampled_from(FLOATS))
def test_a_second_pool_of_the_sinks_dtype_after_one_of_another_names_the_kept_operands(sink_dtype, first):
    sink = il.SharedSinkLoRA(2, 8, 6, dtype=sink_dtype)
    sink.set_lora_info(*il.LoRAPool(2, 8, 6, 2, 4, dtype=first).buffers())
    sink.set_lora_info(*il.LoRAPool(2, 8, 6, 2, 4, dtype=sink_dtype).buffers())  # upstream's state semantics
    assert sink.w1_delta.dtype == first  # kept, as upstream keeps them
    batch = il.SlotBatch.from_token_slots([0, 1, -1], num_slots=2)
    x, g = torch.randn(3, 8, dtype=sink_dtype), torch.rand(3, 2)
    for backend in ("torch", "reference"):
        if first == sink_dtype:
            assert torch.isfinite(sink(x, g, batch=batch, backend=backend)).all()
            continue
        with pytest.raises(TypeError) as raised:
            sink(x, g, batch=batch, backend=backend)
        assert find_entry(raised.value).code == "ISL-K165"
        text = str(raised.value)
        name = str(first).removeprefix("torch.")
        assert f"w1_delta {name}" in text and f"a_cat {name}" in text and "sink.clear_pool()" in text
    if first != sink_dtype:  # the way out the message gives works
        sink.clear_pool()
        sink.set_lora_info(*il.LoRAPool(2, 8, 6, 2, 4, dtype=sink_dtype).buffers())
        assert sink(x, g, batch=batch, backend="torch").shape == (3, 8)


# -- names that are not UTF-8, or hold escapes and line breaks, under a strict UTF-8 stdout -----------------------

HOSTILE_NAME = b"ad\xff\x1b[31m\x1b]0;owned\x07\nExit status 0\tz"
STRICT = {"PYTHONIOENCODING": "utf-8:strict", "LANG": "C", "LC_ALL": "C"}


@pytest.fixture(scope="module")
def hostile_folder(tmp_path_factory):
    if sys.platform != "linux":
        pytest.skip("non-UTF-8 file names: a Linux filesystem")
    root = tmp_path_factory.mktemp("names")
    folder = os.fsdecode(os.path.join(os.fsencode(root), HOSTILE_NAME))
    shutil.copytree(SAMPLES / "rank8", folder)
    return folder


COMMANDS = {
    "doctor": lambda d: ["doctor", d, *TOY],
    "doctor --json": lambda d: ["doctor", d, *TOY, "--json"],
    "doctor, a huge rank": lambda d: ["doctor", d, *TOY, "--max-rank", str(2 ** 30)],
    "compare --json": lambda d: ["compare", d, *TOY, "--json"],
    "convert": lambda d: ["convert", d, "-n", "2", "-q", "-o", os.path.join(d, "pool\n.safetensors")],
    "convert over its input": lambda d: ["convert", d, "-n", "2", "-q", "-o", d, "--force"],
    "export --json": lambda d: ["export", d, "-n", "2", "-q", "-o", d + "\x1b.out", "--json"],
    "explain": lambda d: ["explain", "ValueError: Inkling shared-sink LoRA requires four 4D MoE buffers " + d],
    "selfcheck --wheel": lambda d: ["selfcheck", "--wheel", os.path.join(d, "x.whl"), "--cases", "1"],
    "selfcheck --download": lambda d: ["selfcheck", "--download", "0.5.23" + d, "--cache", d, "--cases", "1"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_hostile_folder_name_is_printed_escaped_by_every_command(hostile_folder, command):
    result = run_cli(*COMMANDS[command](hostile_folder), env=STRICT)  # the strict stdout emulated
    out = result.stdout + result.stderr
    assert result.returncode in (0, 1), out[-2000:]
    assert b"Traceback" not in out and b"UnicodeEncodeError" not in out
    # no control character reaches the terminal but the report's own newlines and tabs ...
    assert not [c for c in out if c < 0x20 and c not in b"\n\t"], out[-2000:]
    # ... and the name's own line break and tab are shown escaped: no forged "Exit status 0" line
    assert b"\nExit status 0\tz" not in out and not any(line.startswith(b"Exit status 0\t") for line in out.splitlines())
    if "--json" in command:
        json.loads(result.stdout)
    if command == "doctor":
        assert b"ad\\xff\\x1b[31m\\x1b]0;owned\\x07\\nExit status 0\\tz" in result.stdout
    if command == "convert over its input":  # refused: the adapter is never replaced
        assert (Path(hostile_folder) / "adapter_model.safetensors").is_file()


# -- the public API given what is not its argument: a clear error by name, never Python's or torch's own ----------

NOT_ARGUMENTS = st.sampled_from([None, "4", "", True, 2.5, float("nan"), [1, 2], (2,), object(), torch.tensor(2)])


def _raised_by_the_kit(call) -> BaseException:
    try:
        call()
    except (TypeError, ValueError) as exc:
        import traceback

        last = traceback.extract_tb(exc.__traceback__)[-1].filename
        assert "inkling_lab" in last, f"{type(exc).__name__}: {exc} raised from {last}"
        return exc
    raise AssertionError("nothing was raised")


@settings(max_examples=40)
@given(value=NOT_ARGUMENTS)
def test_paths_that_are_no_paths_are_refused_by_name(value):
    calls = {"the adapter folder": lambda: il.load_adapter(value), "load_pool: path": lambda: il.load_pool(value),
             "sink_from_checkpoint: path": lambda: il.sink_from_checkpoint(value),
             "doctor: adapter": lambda: il.doctor(value, 2, 8, 6)}
    if isinstance(value, str):  # a string is a path: a missing one is the file's own refusal
        return
    for what, call in calls.items():
        assert what in str(_raised_by_the_kit(call))


@settings(max_examples=40)
@given(value=NOT_ARGUMENTS)
def test_a_batch_or_backend_of_the_wrong_type_is_named(value):
    sink = il.SharedSinkLoRA(2, 8, 6)
    sink.set_lora_info(*il.LoRAPool(2, 8, 6, 3, 4).buffers())
    if value is not None:
        assert "batch must be a SlotBatch" in str(_raised_by_the_kit(
            lambda: sink(torch.randn(3, 8), torch.rand(3, 2), batch=value)))
    assert "backend must be a LoRABackend" in str(_raised_by_the_kit(lambda: sink.initialize_lora(value)))
    assert sink.lora_buffers is not None  # the failed call changed nothing


@pytest.mark.parametrize("call, words", [
    (lambda: il.SlotBatch.from_token_slots([0], num_slots=2 ** 70), "SlotBatch: num_slots"),
    (lambda: il.normalize_shared_sink({}, 0), "n_shared_experts must be a whole number"),
    (lambda: il.defect_report("4"), "defect_report takes"),
    (lambda: __import__("inkling_lab.widgets").widgets.parse_shape(None), "a shape is text"),
    (lambda: __import__("inkling_lab.exercises").exercises.first_error("ISL-E001", torch.tensor(2), 2),
     "first_error: shapes"),
], ids=["num_slots", "normalize_n", "defect_report", "parse_shape", "first_error"])
def test_a_value_out_of_its_domain_is_refused_by_the_kit(call, words):
    assert words in str(_raised_by_the_kit(call))


# -- the CLI's paths and sizes (335 hostile command lines swept: these are what they found) ------------------------

def test_no_hang_selfcheck_refuses_a_wheel_that_is_no_regular_file(tmp_path):
    fifo = tmp_path / "sglang.whl"
    os.mkfifo(fifo)
    for wheel in (fifo, "/dev/zero"):  # the hang guard: a FIFO blocks a read forever, /dev/zero never ends
        result = forked_cli("selfcheck", "--wheel", str(wheel), "--cases", "1", hang_guard=HANG_GUARD)
        assert result.returncode == 1 and b"ISL-K232" in result.stderr and b"Traceback" not in result.stderr
    (tmp_path / "junk.whl").write_bytes(b"not a zip")
    result = run_cli("selfcheck", "--wheel", str(tmp_path / "junk.whl"), "--cases", "1")  # nothing to block on
    assert result.returncode == 1 and b"junk.whl: not a wheel" in result.stderr


@pytest.mark.parametrize("argv", [
    ["doctor", "", *TOY], ["compare", "", *TOY], ["convert", "", "-n", "2", "-o", "OUT", "-q"],
    ["export", "", "-n", "2", "-o", "OUT", "-q"]], ids=["doctor", "compare", "convert", "export"])
def test_an_empty_adapter_path_is_refused_not_read_as_the_current_folder(tmp_path, monkeypatch, capsys, argv):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(SAMPLES / "gate_up", tmp_path / "gate_up")  # a named adapter the current folder would offer
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 1 and "empty path" in out + err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gate_up"]  # nothing written


@pytest.mark.parametrize("argv", [["convert", str(SAMPLES / "gate_up"), "-n", str(2 ** 70), "-o", "OUT", "-q"],
                                  ["export", str(SAMPLES / "gate_up"), "-n", str(2 ** 70), "-o", "OUT", "-q"]],
                         ids=["convert", "export"])
def test_a_shared_expert_count_past_any_model_is_refused_by_name(tmp_path, monkeypatch, capsys, argv):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "n_shared_experts must be in 1..2147483647" in err and "ISL-K162" in err
    assert not list(tmp_path.iterdir())


def test_convert_and_compare_take_lists_of_adapters_not_one():
    from inkling_lab.compare import compare

    adapter = il.load_adapter(SAMPLES / "gate_up")
    for wrong in (adapter, str(SAMPLES / "gate_up"), [None], ["gate_up"], 4):
        assert "convert: adapters must be a list of Adapters" in str(_raised_by_the_kit(
            lambda: il.convert_adapters(wrong, 2)))
    for wrong in (str(SAMPLES / "gate_up"), [], adapter):  # a string would be walked letter by letter
        assert "compare: adapters must be a non-empty list" in str(_raised_by_the_kit(lambda: compare(wrong, 2, 8, 6)))


# -- adapter configs of the wrong types (86 hostile folders swept through doctor, convert, compare, export) --------

CONFIG = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["gate_proj", "up_proj", "down_proj"]}


@pytest.mark.parametrize("field, value, sglang_says", [
    ("target_modules", 4, "only supports inferring LoRA target modules when a list"),  # lora_manager's check
    ("target_modules", [4], "AttributeError: 'int' object has no attribute 'split'"),  # its split, unguarded
    ("target_modules", "gate_proj", "does not recognize target_modules"),
    ("modules_to_save", 4, None),  # sglang does not read it: it loads
], ids=["int", "list_of_int", "string", "modules_to_save_int"])
def test_a_config_field_of_the_wrong_type_gets_upstreams_verdict_and_the_kits_refusal(tmp_path, field, value,
                                                                                      sglang_says):
    folder = tmp_path / "ad"
    shutil.copytree(SAMPLES / "gate_up", folder)
    (folder / "adapter_config.json").write_text(json.dumps({**CONFIG, field: value}))
    report = il.doctor(folder, 2, 8, 6, measure=False)  # never raises on the adapter's contents
    if sglang_says is None:
        assert report.load.outcome == "loads"
    else:
        assert report.load.outcome == "raises" and sglang_says in report.load.text
    if field == "target_modules" and isinstance(value, str):
        return  # the kit converts the math whatever the server's targets
    assert report.kit.outcome == "refuses" and f"{field} must be a module name or a list" in report.kit.text


def test_a_config_whose_json_python_cannot_read_is_sglangs_json_error_not_a_crash(tmp_path):
    folder = tmp_path / "ad"
    shutil.copytree(SAMPLES / "gate_up", folder)
    (folder / "adapter_config.json").write_text('{"r": 4' + "0" * 5000 + ', "lora_alpha": 8}')  # past int's digit limit
    report = il.doctor(folder, 2, 8, 6, measure=False)
    assert report.load.outcome == "raises" and report.load.text.startswith("ValueError: Exceeds the limit")
    assert report.kit.outcome == "refuses"


@settings(max_examples=40)
@given(targets=st.one_of(st.none(), st.integers(), st.text(max_size=8), st.lists(st.one_of(st.integers(), st.text(
    max_size=8), st.none()), max_size=3)))
def test_server_target_modules_raises_what_get_normalized_target_modules_raises(targets):
    from inkling_lab.sglang_path import server_target_modules

    try:
        got = server_target_modules(targets)
    except (TypeError, AttributeError, ValueError) as exc:
        if isinstance(targets, str):
            assert isinstance(exc, ValueError) and targets not in ("all", "all-linear")
        else:
            assert targets is None or isinstance(targets, int) or any(not isinstance(t, str) for t in targets)
        return
    assert got == {"all"} if isinstance(targets, str) else all(isinstance(t, str) for t in targets)


# -- transformers checkpoints (45 hostile checkpoints and arguments swept): NaN or overflowing weights named --------

@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(param=st.sampled_from(["gate_proj", "up_proj", "down_proj"]), value=st.sampled_from(
    [float("nan"), float("inf"), 1e5, 1.0]), dtype=st.sampled_from([None, torch.float16, torch.bfloat16]))
def test_no_silent_nan_a_checkpoint_sink_that_is_not_finite_as_read_or_as_cast_is_refused(tmp_path_factory, param,
                                                                                         value, dtype):
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("ckpt")
    p = "model.layers.0.mlp.shared_experts."
    state = {p + "gate_proj": torch.zeros(2, 6, 8), p + "up_proj": torch.zeros(2, 6, 8),
             p + "down_proj": torch.zeros(2, 8, 6)}
    state[p + param][0, 0, 0] = value
    save_file(state, folder / "model.safetensors")
    finite = torch.isfinite(torch.tensor(value).to(dtype or torch.float32))
    if finite:
        sink = il.sink_from_checkpoint(folder, dtype=dtype)
        assert torch.isfinite(sink.w13).all() and torch.isfinite(sink.w2).all()
        return
    with pytest.raises(ValueError) as raised:
        il.sink_from_checkpoint(folder, dtype=dtype)
    assert find_entry(raised.value).code == "ISL-K423" and param in str(raised.value)
    with pytest.raises(TypeError, match="layer must be a layer number"):
        il.sink_from_checkpoint(folder, layer="0")


# -- tensors and objects out of their domain (715 more hostile calls swept) -----------------------------------------

def test_a_failed_save_adapter_makes_nothing_on_disk(tmp_path):
    with pytest.raises(TypeError, match="save_adapter: adapter must be an Adapter"):
        il.save_adapter({"r": 4}, tmp_path / "never")
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("call, words", [
    (lambda: il.LoRAPool(2, 8, 6, 2, 4).load(0, il.LoRAFactors(*(t.to("meta") for t in il.LoRAFactors.random(
        2, 8, 6, 2).tensors().values()), lora_alpha=2.0)), "on the meta device"),
    (lambda: il.defect_report(tuple(b.to("meta") for b in il.LoRAPool(2, 8, 6, 2, 4, outer=2).buffers())),
     "holding values (not on meta)"),
    (lambda: il.Scenario.random(il.PRESETS["toy"], sink="x"), "sink must be a SharedSinkLoRA"),
    (lambda: il.to_transformers(None), "to_transformers: sink must be a SharedSink"),
    (lambda: il.sink_from_transformers("x"), "sink_from_transformers: source must be"),
    (lambda: il.make_peft_sink_adapter(None), "make_peft_sink_adapter: folder must be a path"),
], ids=["meta_factors", "meta_defect", "scenario_sink", "to_transformers", "sink_from_transformers", "peft_folder"])
def test_an_object_out_of_its_domain_is_refused_by_name(call, words):
    assert words in str(_raised_by_the_kit(call))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a device this build has not")
def test_a_device_this_build_has_not_is_refused_by_name():
    assert "the device 'cuda' is not available here" in str(_raised_by_the_kit(
        lambda: il.Scenario.random(il.PRESETS["toy"], device="cuda")))


def test_diagnose_pool_of_a_float8_buffer_reports_instead_of_crashing():
    buffers = list(il.LoRAPool(2, 8, 6, 3, 4).buffers())
    buffers[0] = buffers[0].to(torch.float8_e4m3fn)
    diagnosis = il.diagnose_pool(*buffers, n_shared_experts=2)
    assert not diagnosis.ok and diagnosis.codes


# -- the CLI's numbers: what is no whole number is a usage error, what is past any run is refused by name -----------

@pytest.mark.parametrize("value", ["nan", "", "-1", "0", "1e3", "0x10", "8.0", "inf"])
@pytest.mark.parametrize("flag", ["-n", "--hidden", "--max-rank", "--tp"])
def test_a_size_flag_that_is_no_whole_number_of_at_least_1_is_a_usage_error(capsys, flag, value):
    with pytest.raises(SystemExit) as exit_:
        main(["doctor", str(SAMPLES / "rank8"), *TOY, flag, value])
    assert exit_.value.code == 2 and flag in capsys.readouterr().err


def test_selfcheck_refuses_a_case_count_that_would_run_for_days(capsys):
    from inkling_lab.selfcheck import CASES_LIMIT

    assert main(["selfcheck", "--wheel", str(SAMPLES / "rank8" / "adapter_config.json"),
                 "--cases", str(CASES_LIMIT + 1)]) == 1
    assert f"cases must be a whole number in 1..{CASES_LIMIT}" in capsys.readouterr().err


def test_explain_finds_a_shared_sink_error_inside_nested_exception_groups():
    inner = ValueError("Inkling shared-sink LoRA requires four 4D MoE buffers")
    group = ExceptionGroup("tasks", [KeyError("other"), ExceptionGroup("nested", [inner])])
    assert il.explain(group).code == "ISL-E001"
    cycle = ExceptionGroup("loop", [RuntimeError("x")])
    cycle.exceptions[0].__context__ = cycle  # a cycle through the group ends the walk
    with pytest.raises(LookupError):
        il.explain(cycle)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a device this build has not")
@pytest.mark.parametrize("device", ["nope", "cuda", 5])
def test_slot_batch_to_a_device_it_cannot_reach_is_refused_by_name(device):
    batch = il.SlotBatch.from_token_slots([0, 1], 2)
    assert "SlotBatch.to: the device" in str(_raised_by_the_kit(lambda: batch.to(device)))


def test_no_hang_profile_show_of_a_fifo_is_refused_unopened(tmp_path):
    fifo = tmp_path / "record.json"
    os.mkfifo(fifo)
    result = forked_cli("profile", "--show", str(fifo), hang_guard=HANG_GUARD)  # a FIFO blocked the read forever
    assert result.returncode == 2 and b"ISL-K232" not in result.stdout and b"not a regular file" in result.stderr
    (tmp_path / "junk.json").write_text("{")
    result = run_cli("profile", "--show", str(tmp_path / "junk.json"))  # nothing to block on
    assert result.returncode == 2 and b"junk.json: not a profile record (not JSON" in result.stderr


def test_no_hang_profile_against_a_fifo_is_refused_unopened(tmp_path):
    """The second pass of ``--show FIRST --against SECOND`` is read the same careful way as the first."""
    first = Path(__file__).resolve().parents[1] / "data" / "profiles" / "h200_side_by_side.json"
    fifo = tmp_path / "second.json"
    os.mkfifo(fifo)
    for argv in (("--show", str(first), "--against", str(fifo)), ("--show", str(fifo), "--against", str(first))):
        result = forked_cli("profile", *argv, hang_guard=HANG_GUARD)
        assert result.returncode == 2 and b"not a regular file" in result.stderr and not result.stdout


@pytest.mark.parametrize("call, words", [
    (lambda w: w.tp_shard_explorer(intermediate=0), "intermediate starts its slider, which runs over 1..16"),
    (lambda w: w.tp_shard_explorer(n="x"), "n starts its slider, which runs over 1..4"),
    (lambda w: w.adapter_explorer(folder=str(SAMPLES / "rank8" / "adapter_config.json")), "folder must be a folder"),
    (lambda w: w.adapter_explorer(folder=""), "folder must be a folder"),
    (lambda w: w.roofline_explorer({"x": 1}), "record must be a profile record with its ceilings"),
], ids=["tp_F", "tp_n", "adapter_folder", "adapter_empty", "roofline_record"])
def test_a_widget_started_off_its_sliders_or_records_is_refused_by_name(call, words):
    from inkling_lab import widgets

    assert words in str(_raised_by_the_kit(lambda: call(widgets)))


def test_a_model_config_that_is_no_json_object_or_no_file_is_named(tmp_path, capsys):
    folder = tmp_path / "ad"
    shutil.copytree(SAMPLES / "gate_up", folder)
    (folder / "config.json").write_text("[1]")  # a model config beside the adapter, of the wrong kind
    assert main(["doctor", str(folder), *TOY]) == 1
    assert "config.json: not a model config (a JSON object), but list" in capsys.readouterr().err
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    result = _cli("export", str(SAMPLES / "gate_up"), "-n", "2", "-q", "-o", str(tmp_path / "out"), "--config",
                  str(fifo))  # the hang guard: the FIFO blocked the read
    assert result.returncode == 1 and b"ISL-K232" in result.stderr + result.stdout
    assert not (tmp_path / "out").exists()


def test_convert_reads_a_one_shot_iterable_of_adapters_once(tmp_path):
    from inkling_lab.convert import convert_to_file

    adapter = il.load_adapter(SAMPLES / "gate_up")
    assert [s.adapter for s in il.convert_adapters((a for a in [adapter, adapter]), 2).slots] == ["gate_up"] * 2
    written = convert_to_file(iter([adapter]), tmp_path / "pool.safetensors", 2)
    assert [s.adapter for s in written.slots] == ["gate_up"] and (tmp_path / "pool.safetensors").is_file()


def test_no_silent_agreement_compare_of_a_one_shot_iterable_compares_every_adapter():
    from inkling_lab.compare import compare

    listed = compare([str(SAMPLES / "rslora")], 2, 8, 6)
    once = compare((folder for folder in [str(SAMPLES / "rslora")]), 2, 8, 6)  # walked twice, it compared nothing
    assert not listed.agree and not once.agree and len(once.rows) == len(listed.rows) > 0
