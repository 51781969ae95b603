import inkling_lab as il
from fresh_interpreter import fresh_imports


def test_every_public_name_resolves():
    for name in il.__all__:
        assert getattr(il, name) is not None, name
    assert il.convert_adapters is il.convert.convert
    assert set(il.__all__) <= set(dir(il))


def test_importing_the_package_needs_only_torch():
    assert fresh_imports()["heavy_after_the_package"] == []  # a fresh interpreter's


def test_unknown_names_fail_plainly():
    try:
        il.no_such_thing
    except AttributeError as exc:
        assert "no attribute 'no_such_thing'" in str(exc)
    else:
        raise AssertionError("il.no_such_thing resolved")
