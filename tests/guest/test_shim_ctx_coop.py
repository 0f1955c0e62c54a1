"""Context creation parameters, context limits and cooperative launches through the
libcuda.so.1 shim, against the agent with the GPU test double (issue 27):
cuda/ctx_limits_coop.c makes contexts with and without CUctxCreateParams, sets limits
(one past the slice's quota) and launches cooperative grids, one too large."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.guest.test_shim_vmm import build, run

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    return build(tmp_path_factory.mktemp("ctx_limits_coop"), "ctx_limits_coop", ("-Wno-deprecated-declarations",))


def test_contexts_limits_and_cooperative_launches_run_through_the_shim(exe, fake_agent):
    out = run(exe, fake_agent.address)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == (
        "cuCtxCreate: NULL and empty params made a context; affinity and CIG refused\n"
        "limits: stack 4016, heap 32 MiB\n"
        "cooperative: supported 1; a grid past the resident blocks refused at the call, "
        "two launches ran: y = 5\n"
        "ctx_limits_coop: ok\n")
    for said in ("cuCtxCreate with execution affinity refused", "cuCtxCreate in CIG mode",
                 "cuLaunchCooperativeKernelMultiDevice refused"):
        assert said in out.stderr, said


def test_a_limit_past_the_slice_is_refused_and_its_charge_goes_with_the_program(exe, sliced):
    out = run(exe, sliced.vm_address("vm1"), "quota")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[-1] == ("quota: a heap past the slice refused, the limit "
                                           "left at its value; 16 MiB taken")
    deadline = time.monotonic() + 20
    while sliced.api.status()[0]["mem_used"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sliced.api.status()[0]["mem_used"] == 0
