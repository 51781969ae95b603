import json

import pytest
import torch

from inkling_lab import records


def test_relative_error_max_and_fro():
    ref = torch.tensor([[3.0, -4.0], [0.0, 1.0]])
    out = ref + torch.tensor([[0.5, 0.0], [0.0, -1.0]])
    assert records.relative_error(out, ref) == pytest.approx(1.0 / 4.0)
    assert records.relative_error(out, ref, norm="fro") == pytest.approx((0.25 + 1) ** 0.5 / 26 ** 0.5)
    assert records.relative_error(torch.zeros(2), torch.zeros(2)) == 0.0
    assert records.relative_error(torch.ones(2), torch.zeros(2)) == 1.0   # no scale: the raw difference
    assert records.relative_error(torch.empty(0), torch.empty(0)) == 0.0
    with pytest.raises(ValueError, match="norm must be"):
        records.relative_error(out, ref, norm="l1")


def test_dtype_name_and_environment():
    assert records.dtype_name(torch.bfloat16) == "bfloat16"
    env = records.environment("cmd --x")
    assert env["command"] == "cmd --x" and env["torch"] == torch.__version__ and "date" in env


def test_load_record_names_missing_keys(tmp_path):
    path = records.write_json(tmp_path / "r.json", {"environment": {}})
    assert json.loads(path.read_text()) == {"environment": {}}
    assert records.load_record(path) == {"environment": {}}
    with pytest.raises(ValueError, match=r"not a thing \(missing \['x'\]\); make one with `make x`"):
        records.load_record(path, ("x",), "thing", "`make x`")


def test_the_callers_commit_wins_over_the_checkouts(monkeypatch):
    from inkling_lab import records as rc

    monkeypatch.setenv("INKLING_LAB_COMMIT", "f" * 40)
    assert rc.git_commit() == "f" * 40 and rc.environment("x")["git_commit"] == "f" * 40
    monkeypatch.delenv("INKLING_LAB_COMMIT")
    assert rc.git_commit() is None or len(rc.git_commit()) == 40
