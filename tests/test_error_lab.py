"""The error lab (widgets.error_lab*): what each generation's set_lora_info says, and an
'apply fix' that leads to four buffers that validate."""
import pytest

from inkling_lab.validate import validate_pool
from inkling_lab.widgets import ERROR_LAB_PRESETS, error_lab, error_lab_fixed, error_lab_report, parse_shape


@pytest.mark.parametrize("name", list(ERROR_LAB_PRESETS))
@pytest.mark.parametrize("generation", ["v1", "v2"])
def test_every_preset_reports_for_both_generations(name, generation):
    report = error_lab_report(*ERROR_LAB_PRESETS[name], generation=generation)
    first = report.splitlines()[0]
    assert ("second generation" if generation == "v2" else "first generation") in first
    fixed = error_lab_fixed(*ERROR_LAB_PRESETS[name])
    if fixed is not None:
        n = ERROR_LAB_PRESETS[name][0]
        validate_pool(*(parse_shape(s) for s in fixed), n_shared_experts=n, generation=generation)
        assert "passes" in report.splitlines()[-1]


def test_the_v2_words_for_a_missing_slot_axis():
    report = error_lab_report(*ERROR_LAB_PRESETS["one adapter, no slot axis"], generation="v2")
    assert "not enough values to unpack (expected 4, got 3)  [ISL-E021]" in report.splitlines()[0]


def test_the_issue_16_cases_compose():
    assert error_lab_fixed(*ERROR_LAB_PRESETS["one slot's gate-up A"])[0] == "3, 1, 8, 16"
    report = error_lab_report(*ERROR_LAB_PRESETS["down B transposed"])
    assert "[ISL-E005]" in report and "[ISL-D101]" not in report
    assert error_lab_fixed(*ERROR_LAB_PRESETS["valid, shared outer"]) is None
    assert "No plain fix for gate_up_b" in error_lab_report(*ERROR_LAB_PRESETS["odd 2F"])


def test_the_widget_applies_the_fix_and_switches_generation():
    lab = error_lab()
    preset, n, generation, *boxes, apply, out = lab.children[1:]
    preset.value = "one slot's gate-up A"
    assert boxes[0].value == "1, 8, 16" and not apply.disabled
    apply.click()
    assert [b.value for b in boxes] == ["3, 1, 8, 16", "3, 2, 12, 4", "3, 2, 4, 6", "3, 1, 16, 4"]
    assert apply.disabled  # nothing left to fix
    generation.value = "v2"  # re-renders without error
