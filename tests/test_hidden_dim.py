"""Inkling's supported LoRA modules: a server target module its ``get_hidden_dim`` has no
buffer for stops the server's start (ISL-E038), in every release; the doctor's fixes cure it."""
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import inkling_lab.selfcheck as sc
from inkling_lab import explain
from inkling_lab.adapters import save_adapter, synthetic_adapter
from inkling_lab.catalog import RELEASES
from inkling_lab.doctor import doctor
from inkling_lab.sglang_path import run_sglang, server_target_modules, unserved_modules

SINK = ["gate_proj", "up_proj", "down_proj"]
NAMES = ["q_proj", "k_proj", "v_proj", "o_proj", "wq_du", "wo_ud", "qkvr", "w1", "gate_up_proj", "lm_head",
         "embed_tokens", "out_proj"]


def _saved(tmp_path, targets):
    ad = synthetic_adapter(2, 8, 6, 4)
    ad.target_modules = list(targets)
    return save_adapter(ad, tmp_path / "in")


@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize("extra, named", [(["q_proj", "v_proj"], "qkv_proj"), (["o_proj"], "o_proj"),
                                          (["wq_du", "wk_dv", "wv_dv", "wr_du"], "wk_dv")])
def test_an_adapter_naming_a_module_inkling_has_no_buffer_for_stops_the_start(tmp_path, version, extra, named):
    run = run_sglang(_saved(tmp_path, SINK + extra), 2, 8, 6, sglang=version)
    assert run.raised.stage == "targets" and run.raised.text == f"NotImplementedError: get_hidden_dim not implemented for {named}"
    assert "InklingForConditionalGeneration.get_hidden_dim" in run.raised.upstream
    assert ("string-hash order" in run.raised.note) == (len(unserved_modules(run.server)) > 1)
    fix = run.raised.finding.fix
    assert "in the adapter's target_modules" in fix and not re.search(r"--lora-target-modules [a-z]", fix)


def test_inkling_s_own_modules_start_and_a_flag_is_the_cure_where_the_flag_is_the_cause(tmp_path):
    folder = _saved(tmp_path, SINK + ["qkvr", "wo_ud"])
    assert run_sglang(folder, 2, 8, 6).raised is None
    report = doctor(_saved(tmp_path / "b", SINK), 2, 8, 6, target_modules=["gate_up_proj", "down_proj", "o_proj"])
    assert report.load.text == "NotImplementedError: get_hidden_dim not implemented for o_proj"
    assert report.exit_status == 1 and report.load.stage == "targets"
    (flag,) = re.findall(r"--lora-target-modules ((?:[a-z_]+ ?)+)", report.findings[0].fix)
    assert doctor(_saved(tmp_path / "c", SINK), 2, 8, 6, target_modules=flag.split()).exit_status == 0


@settings(max_examples=40, deadline=None)
@given(own=st.lists(st.sampled_from(NAMES), max_size=3), flag=st.none() | st.lists(st.sampled_from(NAMES), max_size=3))
def test_the_fix_never_names_a_flag_that_fails(tmp_path_factory, own, flag):
    """Whatever the adapter and the flag name: where the kit says the server does not start, a
    flag it advises starts it (no ISL-E038, no ISL-E034); where it names none, the adapter's own
    target_modules name a module Inkling has no buffer for."""
    tmp = tmp_path_factory.mktemp("hd")
    folder = _saved(tmp, SINK + own)
    run = run_sglang(folder, 2, 8, 6, target_modules=None if flag is None else SINK + flag)
    if run.raised is None or not run.raised.text.startswith("NotImplementedError"):
        return
    advised = re.findall(r"--lora-target-modules ((?:[a-z_]+ ?)+)", run.raised.finding.fix)
    if not advised:
        assert unserved_modules(server_target_modules(SINK + own)), run.raised.finding.fix
        return
    again = run_sglang(folder, 2, 8, 6, target_modules=advised[0].split())
    assert again.raised is None or again.raised.stage != "targets", again.raised  # no ISL-E038, no ISL-E034


def test_explain_names_the_entry_and_the_file_and_function():
    entry = explain("NotImplementedError: get_hidden_dim not implemented for qkv_proj")
    assert entry.code == "ISL-E038" and set(entry.releases) == set(RELEASES)
    assert "models/inkling.py: InklingForConditionalGeneration.get_hidden_dim" in entry.upstream


@pytest.mark.parametrize("version", RELEASES)
def test_every_cached_wheel_s_get_hidden_dim_agrees(version, monkeypatch):
    """The wheel's own supported_lora_modules and get_hidden_dim, run on a stub model, against the
    kit; a kit that thinks every module has a buffer is caught."""
    wheel = sc.cached_wheel(version)
    if wheel is None:
        pytest.skip(f"no sglang {version} wheel in {sc.wheel_cache()} ($INKLING_LAB_WHEELS)")
    area = {a.area: a for a in sc.selfcheck(wheel, cases=60).areas}["hidden_dim"]
    assert area.status == "agree", area
    monkeypatch.setattr(sc, "unserved_modules", lambda server: [])
    area = {a.area: a for a in sc.selfcheck(wheel, cases=60).areas}["hidden_dim"]
    assert area.status == "disagree" and "get_hidden_dim not implemented for" in area.first
