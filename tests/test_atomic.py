import pytest

from inkling_lab.atomic import atomic_write


def test_writes_creates_folders_and_replaces(tmp_path):
    path = atomic_write(tmp_path / "a" / "b.bin", b"one")
    assert path.read_bytes() == b"one"
    atomic_write(path, b"two")
    assert path.read_bytes() == b"two"
    assert [p.name for p in path.parent.iterdir()] == ["b.bin"]  # no temporary left behind


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = atomic_write(tmp_path / "r.json", b"old")
    with pytest.raises(TypeError):
        atomic_write(path, "not bytes")  # type: ignore[arg-type]
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
