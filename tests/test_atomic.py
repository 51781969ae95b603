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


def test_without_hard_links_an_exclusive_write_still_refuses_an_existing_name(tmp_path, monkeypatch):
    import errno
    import os

    def no_links(src, dst, **kw):
        raise OSError(errno.EPERM, "Operation not permitted")  # FAT, some FUSE mounts

    monkeypatch.setattr(os, "link", no_links)
    path = atomic_write(tmp_path / "new.bin", b"one", exclusive=True)
    assert path.read_bytes() == b"one"
    with pytest.raises(FileExistsError, match="refusing to write new.bin: it already exists"):
        atomic_write(path, b"two", exclusive=True)
    assert path.read_bytes() == b"one" and [p.name for p in tmp_path.iterdir()] == ["new.bin"]
