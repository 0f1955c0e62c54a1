"""The host side of a VM test: hvgpu's agent with the GPU test double, its slices kept
in WORKDIR/state and its control socket at WORKDIR/control.sock, serving the guest's
hybrid vsock on UDS_5170 as VM ``vm1`` (``--listen hvsock://UDS:5170=vm1``), its region
file in $HVGPU_TEST_REGION_DIR when set. Runs until
SIGTERM; started again on the same WORKDIR it finds the slices it had.

    python -m tests.vm.host_agent WORKDIR UDS [VM]
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

from tests.conftest import FAKE_DEVICE, RunningAgent


def main() -> int:
    work, uds = Path(sys.argv[1]), sys.argv[2]
    vm = sys.argv[3] if len(sys.argv) > 3 else "vm1"
    work.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    agent = RunningAgent(work, FAKE_DEVICE, extra_listen=[f"hvsock://{uds}:5170={vm}"],
                         slices=True)
    if os.environ.get("HVGPU_TEST_REGION_DIR"):  # the VM's region file (QEMU's ivshmem) is there
        agent.agent.config.region_dir = os.environ["HVGPU_TEST_REGION_DIR"]
    print(f"host agent: serving {vm} on hvsock://{uds}:5170, control {agent.control}",
          flush=True)
    stop.wait()
    agent.stop()
    print("host agent: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
