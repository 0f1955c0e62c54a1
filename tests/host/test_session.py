import pytest

from hvgpu.errors import CudaError
from hvgpu.host.executor.session import Allocations, Handles


def test_ranges_inside_allocations_pass_and_others_say_why():
    allocs = Allocations()
    allocs.add(0x1000, 0x100)
    allocs.add(0x3000, 0x100)
    allocs.check(0x1000, 0x100, "dst")
    allocs.check(0x10F0, 0x10, "dst")  # pointer arithmetic inside an allocation
    with pytest.raises(CudaError, match="runs past the end"):
        allocs.check(0x10F0, 0x11, "dst")
    with pytest.raises(CudaError, match="not inside any allocation"):
        allocs.check(0x2000, 1, "dst")
    with pytest.raises(CudaError, match="not inside any allocation"):
        allocs.check(0x0FFF, 1, "dst")
    allocs.remove(0x1000)
    with pytest.raises(CudaError):
        allocs.check(0x1000, 1, "dst")
    with pytest.raises(CudaError, match="not an allocation"):
        allocs.remove(0x3001)
    assert len(allocs) == 1 and allocs.total == 0x100


def test_handles_are_per_kind_and_never_reused():
    table = Handles("event")
    a, b = table.add("a"), table.add("b")
    assert a >= 16 and b == a + 1
    table.pop(a)
    assert table.add("c") == b + 1
    with pytest.raises(CudaError, match="unknown event handle") as info:
        table.get(a)
    assert info.value.status == 400
