"""Shared fixtures: an agent over unix sockets with the test-double GPU, and
the ``gpu`` marker's skip rule."""

from __future__ import annotations

import ctypes.util
import os
import threading
from pathlib import Path

import pytest

from hvgpu.host.agent import Agent, AgentConfig

REPO = Path(__file__).resolve().parent.parent
FAKE_DEVICE = "tests.fake_gpu:FakeDevice"


def _have_gpu() -> bool:
    if os.environ.get("HVGPU_TEST_NO_GPU"):
        return False
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        return False
    err, = cu.cuInit(0)
    if int(err) != 0:
        return False
    err, count = cu.cuDeviceGetCount()
    return int(err) == 0 and count > 0


HAVE_GPU = None


def pytest_collection_modifyitems(config, items):
    global HAVE_GPU
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    if HAVE_GPU is None:
        HAVE_GPU = _have_gpu()
    if not HAVE_GPU:
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU, its driver and cuda-bindings")
        for item in gpu_items:
            item.add_marker(skip)


class RunningAgent:
    """An agent in a thread; with ``slices``, a state directory, a control lane
    and unix sockets bound to VMs (``vm_address(name)``).

    Executors confine themselves as in production (``confine``), as the agent's
    own user unless ``executor_user`` says otherwise; what the test double
    writes (``reports``) is the one extra path they may write."""

    def __init__(self, tmp_path: Path, device: str | None, extra_listen=(), *,
                 slices: bool = False, vms=(), gpus=None, mps: bool = False,
                 connect: str | None = None, executor_user: str | None = None,
                 confine: str = "auto", executor_read=(), executor_write=(),
                 local_region: int | None = None, nvml=None, metrics: str | None = None):
        self.tmp = tmp_path
        self.socket = tmp_path / "agent.sock"
        self.address = f"unix://{self.socket}"
        self.reports = tmp_path / "reports"
        self.reports.mkdir(exist_ok=True)
        # HVGPU_TEST_EXECUTOR_USER runs every test's executors as that user (the GPU
        # machine runs the gpu tests so, as production runs them).
        executor_user = executor_user or os.environ.get("HVGPU_TEST_EXECUTOR_USER") or None
        if executor_user:
            os.chmod(self.reports, 0o777)  # the double writes there as that user
            for d in (tmp_path, *tmp_path.parents):  # pytest's are 0700: let it pass
                if d == Path(d.anchor) or not str(d).startswith("/tmp/"):
                    break
                os.chmod(d, os.stat(d).st_mode | 0o011)
        self.control = str(tmp_path / "control.sock")
        env = {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               "HVGPU_FAKE_REPORT": str(self.reports)}
        listen = [self.address, *extra_listen,
                  *(f"unix://{tmp_path}/{vm}.sock={vm}" for vm in vms)]
        self.config = AgentConfig(listen=listen, vsock_port=None,
                                  cache_dir=str(tmp_path / "cache"), device=device,
                                  state_dir=str(tmp_path / "state") if slices else None,
                                  mps=mps, log_level="DEBUG", env=env, connect=connect,
                                  executor_user=executor_user, run_dir=str(tmp_path / "run"),
                                  confine=confine, executor_read=list(executor_read),
                                  executor_write=[str(self.reports), *executor_write])
        if local_region is not None:  # 0: host-local connections are offered no region
            self.config.local_region = local_region
        self.config.metrics = metrics
        self.gpus = gpus or fake_gpus
        self.agent = Agent(self.config, gpus=self.gpus, nvml=nvml)
        self.agent.start()
        self.server = None
        if slices:
            from hvgpu.host.control_api import ControlAPI
            from hvgpu.host.control_grpc import serve

            self.api = self.agent.commands(ControlAPI(self.agent, self.gpus))
            self.server = serve(self.api, self.control)
        self.thread = threading.Thread(target=self.agent.serve_forever, daemon=True)
        self.thread.start()

    def vm_address(self, vm: str) -> str:
        return f"unix://{self.tmp}/{vm}.sock"

    def stop(self):
        if self.server is not None:
            self.server.stop(1)
        self.agent.stop()
        self.thread.join(timeout=15)


def fake_gpus():
    """The inventory of the GPU test double: one GPU of 1 GiB."""
    from hvgpu.host.inventory import Gpu

    return [Gpu(0, "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f", "hvgpu fake GPU", 1 << 30, 0, 0,
                False, False, "test double")]


@pytest.fixture
def fake_agent(tmp_path):
    running = RunningAgent(tmp_path, FAKE_DEVICE)
    yield running
    running.stop()


@pytest.fixture
def gpu_agent(tmp_path):
    running = RunningAgent(tmp_path, None)
    yield running
    running.stop()
