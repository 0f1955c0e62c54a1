"""``hvgpu-guest``: what this VM's vGPU is, from inside the VM.

    hvgpu-guest info [--json]     the vGPU: name, memory (= quota), compute share
    hvgpu-guest smi               an nvidia-smi-like view of the slice

Standard library only (argparse), so it runs in a VM where nothing but this
package is installed. Must not import ``hvgpu.host``.
"""

from __future__ import annotations

import argparse
import json
import sys

from hvgpu import __version__
from hvgpu.errors import CudaError, HvgpuError, TransportError
from hvgpu.guest.client import ENV_ADDRESS, Connection, default_address
from hvgpu.guest.device import Device
from hvgpu.virtio import protocol as P


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def collect(address=None) -> dict:
    """Everything ``info`` and ``smi`` show, as one dict."""
    address = address or default_address()
    try:
        conn = Connection(address, timeout=5)
    except TransportError as exc:
        raise TransportError(
            f"{exc}\nIn a VM this needs a vsock device and a GPU slice: on the host, "
            f"`hvgpu attach VM --mem SIZE` adds both (${ENV_ADDRESS} names another "
            "address).") from None
    with conn:
        vm, quota, used, compute = conn.call("SLICE_INFO")
        dev = Device(connection=conn)
        major, minor = dev.compute_capability
        return {"agent": conn.agent, "address": str(conn.address), "peer": conn.peer,
                "protocol": conn.version, "vm": vm, "gpus": [{
                    "index": 0, "name": dev.name, "uuid": dev.uuid,
                    "memory_total": quota, "memory_used": used,
                    "compute_share": compute, "multiprocessors": dev.multiprocessor_count,
                    "compute_capability": f"{major}.{minor}",
                    "driver_version": conn.call("DRIVER_GET_VERSION")[0]}]}


def info_text(d: dict) -> str:
    lines = [f"agent: {d['agent']} at {d['address']} (protocol v{d['protocol']}), "
             f"this VM: {d['vm'] or 'no slice: the whole GPU (host-local connection)'}"]
    for g in d["gpus"]:
        share = f"{g['compute_share']}%" if g["compute_share"] else "time-shared"
        lines.append(f"vGPU {g['index']}: {g['name']}, {_gib(g['memory_total'])} "
                     f"({_gib(g['memory_used'])} in use), compute {share}, "
                     f"{g['multiprocessors']} SMs, compute capability {g['compute_capability']}, "
                     f"{g['uuid']}")
    return "\n".join(lines)


def smi_text(d: dict) -> str:
    g = d["gpus"][0]
    v = g["driver_version"]
    width = 78
    bar = "+" + "-" * (width - 2) + "+"
    head = f"hvgpu-guest {__version__}   CUDA driver {v // 1000}.{v % 1000 // 10}   {d['agent']}"
    share = f"{g['compute_share']}%" if g["compute_share"] else "shared"
    row1 = f"{g['index']:>3}  {g['name'][:30]:30}  {'vGPU of ' + (d['vm'] or 'host'):>30}"
    row2 = (f"     {_gib(g['memory_used']):>10} / {_gib(g['memory_total']):<10}  "
            f"compute {share:>7}  SMs {g['multiprocessors']:>4}  cc {g['compute_capability']}")
    return "\n".join([bar, "| " + head.ljust(width - 4) + " |", bar,
                      "| GPU  Name                            " + "Slice".rjust(30) + "   |",
                      "|      Memory used / quota     " + " " * 44 + "|", bar,
                      "| " + row1.ljust(width - 4) + " |", "| " + row2.ljust(width - 4) + " |",
                      bar])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="hvgpu-guest", description="This VM's GPU slices, served by the host's hvgpu agent.",
        epilog=f"The agent is reached at ${ENV_ADDRESS}, else vsock://{P.HOST_CID}:"
               f"{P.DEFAULT_PORT} (the host seen from a VM).")
    ap.add_argument("--version", action="version", version=f"hvgpu-guest {__version__}")
    ap.add_argument("--agent", metavar="ADDR", help=f"agent address (overrides ${ENV_ADDRESS})")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="list this VM's vGPUs (memory = quota, compute share)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    sub.add_parser("smi", help="an nvidia-smi-like view of the slice")
    args = ap.parse_args(argv)
    try:
        d = collect(args.agent)
    except CudaError as exc:
        if exc.status == P.HV_NO_SLICE:
            print(f"hvgpu-guest: no GPU slice is attached to this VM: {exc}", file=sys.stderr)
        else:
            print(f"hvgpu-guest: error: {exc}", file=sys.stderr)
        return 1
    except HvgpuError as exc:
        print(f"hvgpu-guest: {exc}", file=sys.stderr)
        return 1
    if args.command == "info":
        print(json.dumps(d, indent=2) if args.json else info_text(d))
    else:
        print(smi_text(d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
