"""The one error hierarchy: every class its own stable code, and the `expected`
flag deciding what a command line shows."""

from __future__ import annotations

import importlib
import io
import pkgutil

import pytest

import hvgpu
from hvgpu.errors import HvgpuError, report


def _every_error_class():
    for info in pkgutil.walk_packages(hvgpu.__path__, "hvgpu."):
        if not info.name.endswith("__main__"):
            try:
                importlib.import_module(info.name)
            except ImportError:  # a C library (not a Python module) beside the sources
                continue
    todo, seen = [HvgpuError], []
    while todo:
        cls = todo.pop()
        if cls in seen:  # a class of two bases (AgentLost) is met under each
            continue
        seen.append(cls)
        todo += cls.__subclasses__()
    return [cls for cls in seen if cls.__module__.startswith("hvgpu")]


def test_every_error_class_has_a_code_of_its_own():
    classes = _every_error_class()
    assert len(classes) > 20
    owners = {}
    for cls in classes:
        assert "code" in vars(cls), f"{cls.__qualname__} inherits {cls.code!r}: give it its own"
        owners.setdefault(cls.code, []).append(f"{cls.__module__}.{cls.__qualname__}")
    shared = {code: names for code, names in owners.items() if len(names) > 1}
    assert not shared, f"codes shared by several classes: {shared}"


def test_the_shim_missing_is_an_hvgpu_error_with_a_stable_code():
    from hvgpu.guest.shim import ShimMissing

    assert issubclass(ShimMissing, HvgpuError) and ShimMissing.code == "shim-missing"


def test_an_unknown_domain_and_a_vm_without_a_slice_are_told_apart():
    from hvgpu.host.hypervisor import NoSuchVm
    from hvgpu.host.slices import UnknownVm

    assert NoSuchVm.code != UnknownVm.code


class _Bug(HvgpuError):
    code = "test-bug"
    expected = False


def _raised(exc):
    try:
        raise exc
    except HvgpuError as caught:
        return caught


def test_an_expected_error_is_one_line_without_a_traceback():
    out = io.StringIO()
    assert report(_raised(HvgpuError("the VM is not running")), "hvgpu", out) == 1
    assert out.getvalue() == "hvgpu: error: the VM is not running\n"


def test_an_unexpected_error_keeps_its_code_and_traceback():
    out = io.StringIO()
    assert report(_raised(_Bug("the state file is unreadable")), "hvgpu", out) == 1
    text = out.getvalue()
    assert text.startswith("hvgpu: error: the state file is unreadable\n")
    assert "code test-bug" in text and "Traceback (most recent call last)" in text
    assert "_raised" in text  # where it was raised


def test_the_host_cli_reports_through_the_expected_flag(capsys):
    pytest.importorskip("click")
    from hvgpu.host import cli

    with pytest.raises(SystemExit) as stop:
        cli._fail(_raised(_Bug("broken")))
    assert stop.value.code == 1
    assert "Traceback" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        cli._fail(_raised(HvgpuError("no such VM")))
    assert stop.value.code == 1 and capsys.readouterr().err == "hvgpu: error: no such VM\n"
