"""Driver entry points no other sample calls, on a GPU: each program (cuda/misc_driver.c
and cuda/batch_copies.c, driver API only, built with gcc against cuda.h) prints the same
natively and through the shim, line for line; where the driver answers with a status, the status is printed,
so a difference names the call. HVGPU_SHIM_REPORT=DIR keeps what each run printed."""

from __future__ import annotations

import pytest

from tests.guest.test_shim_misc import FLAGS
from tests.guest.test_shim_vmm import build
from tests.guest.test_vmm_gpu import _native_env, _report, _run, _shim_env

pytestmark = pytest.mark.gpu
PROGRAMS = ["misc_driver", "batch_copies"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("misc_driver")
    return {name: build(out, name, FLAGS) for name in PROGRAMS}


@pytest.mark.parametrize("program", PROGRAMS)
def test_program_prints_the_same_through_the_shim(built, program, gpu_agent):
    native = _run(built[program], _native_env())
    shimmed = _run(built[program], _shim_env(gpu_agent.address))
    _report(f"{program}.txt", f"native (rc {native.returncode}):\n{native.stdout}"
            f"{native.stderr}\nshim (rc {shimmed.returncode}):\n{shimmed.stdout}"
            f"{shimmed.stderr}")
    assert native.returncode == 0, native.stdout + native.stderr
    assert shimmed.returncode == 0, shimmed.stdout + shimmed.stderr
    assert shimmed.stdout == native.stdout
