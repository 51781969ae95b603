"""The catalog as data: every code the library mentions is catalogued, every message is
one template that the raiser's text fits, and ``explain`` reads pasted text by a precise,
linear, bounded rule."""
import re
import threading
from pathlib import Path

import pytest

import inkling_lab as il
from inkling_lab.catalog import CATALOG, ENTRIES, pattern_of, template_parts
from inkling_lab.errors import READ_LIMIT, _run_snippet, exception_chain, explain, find_entry, lookup
from in_process import run_cli

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "inkling_lab"
GROUPS = {p.stem for p in (PACKAGE / "catalog").glob("*.py") if p.stem not in ("__init__", "entry")
          and not p.stem.startswith("_")}


def _codes_in_sources() -> set[str]:
    codes = set()
    for path in PACKAGE.rglob("*.py"):
        codes |= set(re.findall(r"ISL-[A-Z]\d{3}", path.read_text(encoding="utf-8")))
    return codes


def test_every_code_the_library_mentions_is_catalogued_with_a_trigger_and_a_fix():
    codes = _codes_in_sources()
    assert {"ISL-D103", "ISL-N201", "ISL-E001"} <= codes  # the grep works
    missing = sorted(c for c in codes if c not in CATALOG)
    assert not missing, f"codes used in inkling_lab/ but not in the catalog: {missing}"
    for code in codes:
        assert CATALOG[code].trigger.strip() and CATALOG[code].fix.strip(), code


def test_entries_are_data_in_their_groups():
    for e in ENTRIES:
        assert e.group in GROUPS, (e.code, e.group)
        assert e.pattern == pattern_of(e.message), f"{e.code}: give the message as a template, not a pattern"
        assert "\n" not in e.message, f"{e.code}: a message is one line"
        assert e.upstream.strip() and e.remedy.strip() and e.generation.strip(), e.code
        assert "follow the advice" not in e.remedy and "fails later or computes something else" not in e.upstream
        if not e.reproduced:
            assert e.sample and (not e.kit_code or e.kit_code in CATALOG), e.code
        if e.by_upstream:
            assert "sglang/" in e.upstream, f"{e.code}: cite the upstream file and function"
    assert {e.group for e in ENTRIES} >= {"set_lora_info", "refresh", "eligibility", "tp", "v2", "loader",
                                          "adapter_files", "normalize", "forward", "warnings", "diagnose"}


def test_templates_name_their_fields():
    assert template_parts("slot {slot} of {n}") == (("slot ", " of ", ""), ("slot", "n"))
    assert template_parts("{{literal}} {x}") == (("{literal} ", ""), ("x",))
    with pytest.raises(ValueError, match="plain identifier"):
        template_parts("out of range: {sorted ids}")
    e = CATALOG["ISL-E002"]
    assert il.catalog.message("ISL-E002", n=4) == \
        "Inkling shared-sink LoRA outer factors must have expert dimension 1 or 4"
    with pytest.raises(TypeError, match=r"missing \['n'\]"):
        e.format()
    assert isinstance(il.catalog.error("ISL-E008", slot_ids=[3]), IndexError)


def _raised(entry):
    """What the kit produces for the entry's trigger: the exception's message, or the
    findings' messages for a finding or note."""
    if entry.kind in ("finding", "note"):
        result = _run_snippet(entry.trigger_source(), "<t>")
        found = result.findings if hasattr(result, "findings") else result
        return [f.message for f in found if f.code == entry.code]
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            _run_snippet(entry.trigger_source(), "<t>")
        except Exception as exc:  # noqa: BLE001 - the trigger's error is the point
            return [str(exc)]
    raise AssertionError(f"{entry.code}: the trigger raised nothing")


@pytest.mark.parametrize("code", sorted(c for c, e in CATALOG.items() if e.reproduced))
def test_the_raised_text_is_the_template_filled_in(code):
    entry = CATALOG[code]
    texts = _raised(entry)
    assert texts, f"{code}: nothing reported"
    for text in texts:
        assert re.fullmatch(entry.pattern, text), f"{code}: {text!r} is not its template {entry.message!r}"


@pytest.mark.parametrize("code", sorted(c for c, e in CATALOG.items() if not e.reproduced))
def test_field_messages_are_explained_alone_and_inside_a_traceback(code):
    entry = CATALOG[code]
    assert explain(entry.sample) is entry
    message = entry.sample.split("] WARNING mem_pool.py:951: ")[-1]
    pasted = ("[2026-11-30 09:12:40] Scheduler hit an exception: Traceback (most recent call last):\n"
              'Traceback (most recent call last):\n'
              '  File "/srv/py/sglang/srt/managers/scheduler.py", line 3011, in run_scheduler_process\n'
              '    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank)\n'
              '  File "/srv/py/sglang/srt/lora/lora_manager.py", line 351, in validate_new_adapter\n'
              "    raise ValueError(\n"
              f"{message}\n[2026-11-30 09:12:41] Received sigquit from a child process.")
    assert explain(pasted) is entry


SGLANG_FRAMES = {  # where in sglang each group's errors are raised, as a traceback shows it
    "set_lora_info": ("srt/models/inkling_common/lora.py", "set_lora_info"),
    "refresh": ("srt/models/inkling_common/lora.py", "_refresh_lora_operands"),
    "eligibility": ("srt/models/inkling_common/lora.py", "initialize_lora"),
    "v2": ("srt/models/inkling_common/lora.py", "set_lora_info"),
    "tp": ("srt/models/inkling_common/lora.py", "slice_moe_lora_a_weights"),
    "loader": ("srt/lora/mem_pool.py", "load_lora_weight_to_buffer"),
    "forward": ("srt/lora/trtllm_lora_temp/inkling_dense.py", "apply_multi_lora"),
}


@pytest.mark.parametrize("code", sorted(c for c, e in CATALOG.items()
                                        if e.reproduced and e.kind == "error" and e.by_upstream))
def test_sglangs_messages_are_explained_alone_and_inside_its_traceback(code):
    entry = CATALOG[code]
    text = _raised(entry)[0]
    line = f"{entry.exc_type.__name__}: {text}"
    if not entry.frame:
        assert explain(text) is entry and explain(line) is entry
    path, fn = SGLANG_FRAMES[entry.group]
    fn = entry.frame[0] if entry.frame else fn
    pasted = _traceback(("/srv/py/sglang/srt/lora/lora_manager.py", "load_lora_adapter"),
                        (f"/srv/py/sglang/{path}", fn), error=line)
    assert explain(pasted + "\n[2026-11-30 10:00:01] Scheduler hit an exception") is entry


# -- the rule for Python's own words ---------------------------------------------------------------

UNPACK = "ValueError: not enough values to unpack (expected 4, got 3)"


def _traceback(*frames, error=UNPACK):
    lines = ["Traceback (most recent call last):"]
    lines += [f'  File "{path}", line {i + 10}, in {fn}\n    x = y' for i, (path, fn) in enumerate(frames)]
    return "\n".join(lines + [error])


SGLANG_V2 = "/usr/lib/python3.12/site-packages/sglang/srt/models/inkling_common/lora.py"


def test_a_bare_unpacking_error_is_not_claimed():
    assert find_entry(UNPACK) is None
    assert find_entry("IndexError: tuple index out of range") is None
    assert find_entry(_traceback(("/home/me/train.py", "main"))) is None


def test_an_unpacking_error_in_the_v2_set_lora_info_frame_is_v2():
    assert explain(_traceback(("/srv/sglang/srt/lora/lora_manager.py", "update_lora_info"),
                              (SGLANG_V2, "set_lora_info"))).code == "ISL-E021"
    assert explain(_traceback((SGLANG_V2, "set_lora_info"),
                              error="ValueError: too many values to unpack (expected 4)")).code == "ISL-E022"
    assert explain(_traceback((SGLANG_V2, "set_lora_info"),
                              error="IndexError: tuple index out of range")).code == "ISL-E023"


def test_the_innermost_frame_decides():
    # set_lora_info is on the stack, but the unpacking failed in other code it called
    assert find_entry(_traceback((SGLANG_V2, "set_lora_info"),
                                 ("/srv/py/torch/nn/modules/module.py", "__getattr__"))) is None
    # another function of the same file
    assert find_entry(_traceback((SGLANG_V2, "_forward_bf16_linearized"))) is None


def test_the_kits_own_v2_errors_are_claimed_through_their_frames():
    import torch

    sink = il.SharedSinkLoRA(2, 8, 6, interleaved=False, dtype=torch.bfloat16)
    sink.initialize_lora(il.LoRABackend("triton_v2", 3), generation="v2")
    ga, gb, da, db = il.LoRAPool(2, 8, 6, 3, 4).buffers()
    with pytest.raises(ValueError) as info:
        sink.set_lora_info(ga[0], gb, da, db)
    assert explain(info.value).code == "ISL-E021"
    with pytest.raises(ValueError) as info:
        il.validate_pool(ga, gb.unsqueeze(0), da, db, n_shared_experts=2, generation="v2")
    assert explain(info.value).code == "ISL-E022"


# -- which entry, when several fit ------------------------------------------------------------------

def test_the_most_specific_message_and_the_named_type_win():
    v1 = ("RuntimeError: Shared-sink LoRA pool shape changed after initialization: gate-up (3, 24, 4) -> "
          "(4, 24, 4), down-A (3, 2, 12) -> (4, 2, 12)")
    assert explain(v1).code == "ISL-E007"
    assert explain("RuntimeError: Shared-sink LoRA pool shape changed after initialization: (3, 4, 12) -> "
                   "(3, 5, 12)").code == "ISL-E020"
    skipped = CATALOG["ISL-W002"].sample.split("WARNING mem_pool.py:951: ")[1]
    assert explain(skipped).code == "ISL-W002"  # logged
    assert explain("ValueError: " + skipped).code == "ISL-E027"  # --lora-strict-loading
    # a log that ends in the outer error: the last catalogued line decides
    log = "ValueError: Inkling shared-sink LoRA expert count does not match\n" + CATALOG["ISL-E025"].sample
    assert explain(log).code == "ISL-E025"


def test_adapter_caused_errors_lead_with_the_doctor():
    text = explain("ValueError: Inkling shared-sink LoRA outer factors must have expert dimension 1 or 4").explain()
    todo = text.split("What to do:\n", 1)[1]
    assert todo.lstrip().startswith("With an adapter in hand, run the doctor on it first: inkling-lab doctor "
                                    "ADAPTER -n N")
    assert "run the doctor" not in explain("ISL-K105").explain()
    # the errors a user meets with an adapter in hand, the 4D check above all
    for code in ("ISL-E001", "ISL-E005", "ISL-E021"):
        text = explain(code.lower()).explain()
        assert "inkling-lab doctor ADAPTER" in text and "inkling-lab export ADAPTER -o OUT" in text, code


# -- bounded and safe -------------------------------------------------------------------------------

def test_a_cyclic_or_very_deep_chain_is_read_without_recursion():
    a, b = ValueError("a"), ValueError(CATALOG["ISL-E004"].message)
    a.__context__, b.__context__ = b, a  # a cycle
    assert explain(a).code == "ISL-E004"
    deep = ValueError("Inkling shared-sink LoRA rank dimensions do not match")
    top = deep
    for i in range(5000):
        top = RuntimeError(f"wrapper {i}")
        top.__cause__, deep = deep, top
    assert len(exception_chain(top)) <= 64  # what is printed of it is capped
    assert explain(top).code == "ISL-E005"  # the chain object is walked to its root, however deep
    shallow = RuntimeError("wrapper")
    shallow.__cause__ = ValueError("Inkling shared-sink LoRA rank dimensions do not match")
    assert explain(shallow).code == "ISL-E005"  # a cause within the cap is read


def test_long_texts_are_cut_to_their_end_and_say_so():
    line = "x" * (2 * READ_LIMIT) + "\nValueError: Inkling shared-sink LoRA expert count does not match"
    entry, cut = lookup(line)
    assert entry.code == "ISL-E004" and cut
    with pytest.raises(il.errors.NoCatalogEntry, match="only the last 64 KiB"):
        explain("y" * (2 * READ_LIMIT))
    assert lookup("Inkling shared-sink LoRA expert count does not match")[1] is False


def test_read_pasted_keeps_only_the_tail():
    import io
    text, note = il.errors.read_pasted(io.StringIO("a" * 300_000 + "END"), limit=1000)
    assert len(text) == 1000 and text.endswith("END") and "300003" in note
    assert il.errors.read_pasted(io.StringIO("short")) == ("short", "")


HOSTILE = [
    # the old `has no matching .*` pattern was quadratic on this; the end holds the rest of the message
    "x: 'k' has no matching " * 50_000 + "': every LoRA factor needs its A and its B",
    "Shared-sink LoRA pool shape changed after initialization: gate-up " * 20_000,
    '  File "' + "a" * 1_000_000,
    "{" * 1_048_576,
]


@pytest.mark.parametrize("text", HOSTILE, ids=["repeated-prefix", "repeated-literal", "frame-line", "braces"])
def test_hostile_one_mib_lines_are_read_in_linear_work(text, monkeypatch):
    """No timing: count the characters the matcher hands to ``str.find``. Linear means
    at most (entries x literals) passes over the bounded text."""
    from inkling_lab.catalog import entry as entry_module

    work = {"chars": 0}
    real = entry_module.find_in_line

    def counting(literals, line):
        work["chars"] += len(line) * sum(1 for lit in literals if lit)
        return real(literals, line)

    monkeypatch.setattr(entry_module, "find_in_line", counting)
    find_entry(text)
    literals = sum(len(template_parts(e.message)[0]) for e in ENTRIES)
    assert work["chars"] <= literals * READ_LIMIT  # plus one `in` per entry over the bounded text
    if "LoRA" in text:  # these hold messages' fixed parts: the matcher had work to do
        assert work["chars"] > 0


def test_explain_on_stdin_with_a_huge_line_returns():
    """The CLI on a 4 MiB single line (the old explain ran past 30 s on 1 MiB), in this
    process (only its output and status are checked: tests/in_process.py); the hang guard
    is a thread joined with a generous bound, which returns as soon as the command does."""
    log = ("has no matching " * 262_144 + "\nValueError: Inkling shared-sink LoRA expert count does not match").encode()
    done = []
    command = threading.Thread(target=lambda: done.append(run_cli("explain", "-", input=log)), daemon=True)
    command.start()
    command.join(timeout=600)
    assert done, "explain on a 4 MiB line did not return within 600 s"
    assert done[0].returncode == 0 and b"ISL-E004" in done[0].stdout


# -- any input -------------------------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_PIECES = st.sampled_from([e.message for e in ENTRIES] + ["\n", "Traceback (most recent call last):\n",
                                                          '  File "x/inkling_common/lora.py", line 3, in set_lora_info\n',
                                                          "ValueError: ", "{", "}", "\x1b[2J", "\x00"])


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.one_of(_PIECES, st.text(max_size=40)), max_size=12))
def test_explain_on_any_text_returns_an_entry_or_says_none_matches(parts):
    text = "".join(parts)
    try:
        entry = explain(text)
    except il.errors.NoCatalogEntry:
        assert find_entry(text) is None
    else:
        assert entry.code in CATALOG


def test_the_cli_error_printer_survives_hostile_chains(capsys):
    from inkling_lab.cli import _fail

    a, b = ValueError("a"), ValueError(CATALOG["ISL-E004"].message)
    a.__context__, b.__cause__ = b, a
    assert _fail("convert", a) == 1
    assert "inkling-lab explain ISL-E004" in capsys.readouterr().err


RAISED_BY_TORCH_OR_PYTHON = ("ISL-E012", "ISL-E013", "ISL-E021", "ISL-E022", "ISL-E023", "ISL-E030")
"""Upstream's errors whose words are torch's or Python's own (a reshape, an index, an
unpacking), raised from inside the kit's code as from inside sglang's: no raiser names
them; their triggers show them raised (test_errors.py)."""


def test_every_entry_is_raised_or_reported_somewhere():
    """The other half of the check above (rustc's tidy checks both): every entry the kit
    writes is named by a raiser or reporter of the library (``error(code, ...)``,
    ``finding(code, ...)``, ``message(code, ...)``, a finding's code), so that the catalog
    holds no entry that nothing writes any more."""
    source = "\n".join(p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py") if "catalog" not in p.parts)
    named = set(re.findall(r'\(\s*"(ISL-[A-Z]\d{3})"', source))  # the code as a call's first argument
    named |= set(re.findall(r'^[A-Z_]+ = "(ISL-[A-Z]\d{3})"$', source, re.M))  # or a raiser's constant
    named |= set(re.findall(r'CATALOG\["(ISL-[A-Z]\d{3})"\]', source))  # or its template taken to format
    assert {"ISL-E002", "ISL-K208", "ISL-D103", "ISL-W101", "ISL-N204"} <= named  # the grep works
    for code in RAISED_BY_TORCH_OR_PYTHON:
        assert CATALOG[code].by_upstream and code not in named, code
    unwritten = sorted(e.code for e in ENTRIES
                       if e.reproduced and e.code not in named and e.code not in RAISED_BY_TORCH_OR_PYTHON)
    assert not unwritten, f"catalog entries that nothing in inkling_lab/ raises or reports: {unwritten}"


def test_groups_map_the_catalog_in_reading_order():
    from inkling_lab.catalog import GROUPS

    assert list(GROUPS)[:4] == ["set_lora_info", "refresh", "eligibility", "v2"]
    assert set(GROUPS) == {e.group for e in ENTRIES} and all(GROUPS.values())
    assert not any("SPEC" in text for text in GROUPS.values())  # the kit's own words, no steering docs


def test_every_message_is_typed_once_in_the_catalog():
    """No raiser retypes a message, sglang's or the kit's own: it formats the catalog's
    template (its message, and its diagnosis, repair note and consequence)."""
    sources = {p: p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py") if "catalog" not in p.parts}
    for e in ENTRIES:
        for template in (e.message, *e.other_templates):
            literal = max(template_parts(template)[0], key=len)
            if len(literal) < 24:  # short generic words (torch's, Python's) say nothing about who typed them
                continue
            copies = [str(p.relative_to(ROOT)) for p, text in sources.items() if literal in text]
            assert not copies, f"{e.code}'s words {literal!r} are typed again in {copies}"


FINDING_BUILT_BY_HAND = {"doctor.py": 1}
"""Where a ``Finding`` is built outside the catalog, and how often: the doctor's verdict
on a refusal, which carries the raised exception's own text (its entry formatted it
where it was raised, ``error(code, ...)``) rather than formatting an entry again."""


def test_findings_are_built_from_their_catalog_entries():
    """Every finding, note and repair note comes from its entry (``finding``,
    ``diagnosis``, ``repair_note``), never typed beside it with ``Finding(...)``."""
    built = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py") if "catalog" not in p.parts
             if (n := len(re.findall(r"\bFinding\(", p.read_text(encoding="utf-8"))))}
    assert built == FINDING_BUILT_BY_HAND


def test_every_diagnosis_and_repair_note_fills_its_entry():
    """The entries' other words name their fields (the loader refuses any other), and the
    kit writes each of them: every upstream check diagnose_pool explains has its
    diagnosis, every repair note its fix."""
    assert {e.code for e in ENTRIES if e.diagnosis} == {f"ISL-E00{i}" for i in range(1, 6)}
    assert {e.code for e in ENTRIES if e.repaired} == {"ISL-K206", "ISL-K211", "ISL-K212", "ISL-K309", "ISL-K310"}
    assert all(e.repaired.fix for e in ENTRIES if e.repaired)
    with pytest.raises(ValueError, match="plain identifier"):
        from dataclasses import replace
        replace(CATALOG["ISL-E004"], diagnosis="{name!r} has {k} experts")


_RAISERS = {  # code -> a call of the kit that writes that entry's words
    "ISL-W001": lambda: il.upstream_defect.defect_report(
        il.LoRAFactors.random(n=2, hidden=8, intermediate=6, rank=4, outer=2, seed=0)).message,
    "ISL-K103": lambda: il.SlotBatch.from_token_slots([0, 5], num_slots=3),
    "ISL-K105": lambda: il.parallel.check_world_size(tp=2, world_size=4),
    "ISL-K106": lambda: il.parallel.resolve_dist_backend("nccl", tp=64),
    "ISL-K153": lambda: _run_snippet(CATALOG["ISL-K153"].trigger_source(), "<k153>"),
}


@pytest.mark.parametrize("code", sorted(_RAISERS))
def test_the_raiser_formats_the_catalogs_template_not_its_own_copy(code, monkeypatch):
    """Change the catalog's words and the kit's message changes with them: the raiser
    holds no copy of them."""
    from dataclasses import replace

    entry = CATALOG[code]
    fields = template_parts(entry.message)[1]
    monkeypatch.setitem(CATALOG, code, replace(entry, message="reworded: " + " ".join(f"{{{f}}}" for f in fields),
                                               pattern=""))
    try:
        text = _RAISERS[code]()
    except Exception as exc:  # noqa: BLE001 - the raised message is the point
        text = str(exc)
    assert text.startswith("reworded: "), text


def _up_only_notes():
    from inkling_lab.adapters import Adapter, synthetic_adapter

    ad = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4)
    repaired = Adapter.from_state(ad.config, {k: v for k, v in ad.weights.items() if ".gate_proj." not in k})
    repaired.factors(2)
    return repaired.findings


_OTHER_WORDS = {  # (code, which words) -> (a call of the kit giving its findings, the Finding field they fill)
    ("ISL-E004", "diagnosis"): (lambda: il.diagnose_pool((3, 1, 8, 8), (3, 1, 12, 4), (3, 2, 4, 6), (3, 1, 8, 4),
                                                         n_shared_experts=2).findings, "message"),
    ("ISL-K211", "repaired"): (_up_only_notes, "message"),
    ("ISL-N001", "consequence"): (lambda: _run_snippet(CATALOG["ISL-N001"].trigger_source(), "<n001>"), "consequence"),
}


@pytest.mark.parametrize("code, words", sorted(_OTHER_WORDS))
def test_a_diagnosis_repair_note_or_consequence_is_the_catalogs_words(code, words, monkeypatch):
    """The same for an entry's other words: reworded in the catalog, the kit's finding
    says the new words."""
    from dataclasses import replace

    entry = CATALOG[code]

    def reworded(template: str) -> str:
        return "reworded: " + " ".join(f"{{{f}}}" for f in template_parts(template)[1])

    if words == "repaired":
        changed = replace(entry, repaired=replace(entry.repaired, message=reworded(entry.repaired.message)))
    else:
        changed = replace(entry, **{words: reworded(getattr(entry, words))})
    monkeypatch.setitem(CATALOG, code, changed)
    call, field = _OTHER_WORDS[code, words]
    (said,) = [getattr(f, field) for f in call() if f.code == code]
    assert said.startswith("reworded: "), said
