"""``hvgpu-guest``: what this VM's vGPU is, from inside the VM.

    hvgpu-guest info [--json]     the vGPU: name, memory (= quota), compute share
    hvgpu-guest smi [--json]      an nvidia-smi-like view of the slice
    hvgpu-guest run -- CMD ARGS   run an unmodified CUDA program on the vGPU (libcuda shim)
    hvgpu-guest coverage [--json] which CUDA driver entry points the shim implements
    hvgpu-guest ldconfig          make the shim this VM's libcuda.so.1 for every program
    hvgpu-guest install           give group hvgpu the VM's shared-memory device (udev rule)
    hvgpu-guest completion SHELL  a bash, zsh or fish completion script
    hvgpu-guest man               the man page (roff)

Every listing takes --json. Output into a pipe that closes early
(``hvgpu-guest coverage | head -2``) ends the command quietly, as it ends cat.
Standard library only (argparse), so it runs in a VM where nothing but this
package is installed. Must not import ``hvgpu.host``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from hvgpu import __version__
from hvgpu.errors import CudaError, HvgpuError, TransportError
from hvgpu.guest import region
from hvgpu.guest.client import ENV_ADDRESS, Connection, default_address
from hvgpu.guest.device import Device
from hvgpu.virtio import protocol as P


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def collect(agent: str | None = None) -> dict:
    """Everything ``info`` and ``smi`` show, as one dict: every vGPU of this VM."""
    address = default_address(0, agent)
    try:
        conn = Connection(address)
    except TransportError as exc:
        raise TransportError(
            f"{exc}\nIn a VM this needs a vsock device and a GPU slice: on the host, "
            f"`hvgpu attach VM --mem SIZE` adds both (${ENV_ADDRESS} names another "
            "address).") from None
    with conn:
        vm, first = _vgpu(0, conn)
        count = conn.call("DEVICE_GET_COUNT")[0]
        gpus = [first]
        agent_version, version, peer = conn.agent, conn.version, conn.peer
    for index in range(1, count):
        try:
            with Connection(default_address(index, agent)) as other:
                gpus.append(_vgpu(index, other)[1])
        except (HvgpuError, OSError) as exc:
            gpus.append({"index": index, "error": str(exc)})
    return {"agent": agent_version, "address": str(address), "peer": peer,
            "protocol": version, "vm": vm, "gpus": gpus, "shm": shm_devices()}


def shm_devices() -> list[dict]:
    """The VM's shared-memory devices, and whether this user may map them."""
    return [{"address": d.address, "resource": str(d.resource), "size": d.size,
             "accessible": d.accessible()} for d in region.devices()]


def shm_text(devices: list[dict]) -> list[str]:
    if not devices:
        return ["shared memory: no device in this VM (bulk copies go over the socket)"]
    return [f"shared memory: device {d['address']}, {_gib(d['size'])}, "
            + ("readable and writable by this user" if d["accessible"] else
               f"not accessible to this user ({d['resource']}: as root, `hvgpu-guest install`, "
               f"then join group {region.GROUP})") for d in devices]


def _vgpu(index: int, conn: Connection) -> tuple[str, dict]:
    """(the VM's name, what info and smi show of its vGPU ``index``)."""
    vm, quota, used, compute = conn.call("SLICE_INFO")
    dev = Device(connection=conn)
    major, minor = dev.compute_capability
    return vm, {"index": index, "address": str(conn.address), "name": dev.name,
                "uuid": dev.uuid, "memory_total": quota, "memory_used": used,
                "compute_share": compute, "multiprocessors": dev.multiprocessor_count,
                "compute_capability": f"{major}.{minor}",
                "driver_version": conn.call("DRIVER_GET_VERSION")[0]}


def info_text(d: dict) -> str:
    lines = [f"agent: {d['agent']} at {d['address']} (protocol v{d['protocol']}), "
             f"this VM: {d['vm'] or 'no slice: the whole GPU (host-local connection)'}"]
    for g in d["gpus"]:
        if "error" in g:
            lines.append(f"vGPU {g['index']}: cannot be reached: {g['error']}")
            continue
        share = f"{g['compute_share']}%" if g["compute_share"] else "time-shared"
        lines.append(f"vGPU {g['index']}: {g['name']}, {_gib(g['memory_total'])} "
                     f"({_gib(g['memory_used'])} in use), compute {share}, "
                     f"{g['multiprocessors']} SMs, compute capability {g['compute_capability']}, "
                     f"{g['uuid']}")
    lines += shm_text(d.get("shm", []))
    return "\n".join(lines)


def smi_text(d: dict) -> str:
    v = d["gpus"][0]["driver_version"]
    width = 78
    bar = "+" + "-" * (width - 2) + "+"
    head = f"hvgpu-guest {__version__}   CUDA driver {v // 1000}.{v % 1000 // 10}   {d['agent']}"
    rows = []
    for g in d["gpus"]:
        if "error" in g:
            rows.append(f"{g['index']:>3}  cannot be reached")
            continue
        share = f"{g['compute_share']}%" if g["compute_share"] else "shared"
        rows.append(f"{g['index']:>3}  {g['name'][:30]:30}  "
                    f"{'vGPU of ' + (d['vm'] or 'host'):>30}")
        rows.append(f"     {_gib(g['memory_used']):>10} / {_gib(g['memory_total']):<10}  "
                    f"compute {share:>7}  SMs {g['multiprocessors']:>4}  "
                    f"cc {g['compute_capability']}")
    return "\n".join([bar, "| " + head.ljust(width - 4) + " |", bar,
                      "| GPU  Name                            " + "Slice".rjust(30) + "   |",
                      "|      Memory used / quota     " + " " * 44 + "|", bar,
                      *["| " + r.ljust(width - 4) + " |" for r in rows], bar])


LDCONFIG_SNIPPET = Path("/etc/ld.so.conf.d/00-hvgpu.conf")


def run_command(command: list[str], agent: str | None) -> int:
    """Exec ``command`` with the shim first on the library path; returns only on failure."""
    from hvgpu.guest.shim import ShimMissing, library

    if not command:
        print("hvgpu-guest run: name a command, e.g. hvgpu-guest run -- python3 train.py",
              file=sys.stderr)
        return 2
    try:
        shim_dir = str(library().parent)
    except ShimMissing as exc:
        print(f"hvgpu-guest run: {exc}", file=sys.stderr)
        return 1
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        [shim_dir] + [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p])
    if agent:
        env[ENV_ADDRESS] = agent
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"hvgpu-guest run: cannot run {command[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127


def coverage_command(as_json: bool, missing_only: bool) -> int:
    from hvgpu.guest.shim import ShimMissing, coverage

    try:
        rows = coverage()
    except ShimMissing as exc:
        print(f"hvgpu-guest coverage: {exc}", file=sys.stderr)
        return 1
    names: dict[str, bool] = {}
    for api, _symbol, implemented in rows:
        names[api] = names.get(api, False) or implemented
    if as_json:
        print(json.dumps({"implemented": sorted(a for a, ok in names.items() if ok),
                          "not_implemented": sorted(a for a, ok in names.items() if not ok)},
                         indent=2))
        return 0
    for api in sorted(names):
        if not (missing_only and names[api]):
            print(f"{'yes' if names[api] else 'no ':4} {api}")
    done = sum(names.values())
    print(f"{done} of the {len(names)} driver entry points of CUDA 13.0's cuda.h are implemented; "
          "the others return CUDA_ERROR_NOT_SUPPORTED and name themselves once on stderr",
          file=sys.stderr)
    return 0


def ldconfig_command(write: bool) -> int:
    from hvgpu.guest.shim import ShimMissing, library

    try:
        shim_dir = library().parent
    except ShimMissing as exc:
        print(f"hvgpu-guest ldconfig: {exc}", file=sys.stderr)
        return 1
    text = f"# hvgpu: the vGPU's libcuda.so.1 shim (hvgpu-guest ldconfig)\n{shim_dir}\n"
    if not write:
        print(f"# {LDCONFIG_SNIPPET} (write it with: hvgpu-guest ldconfig --write; needs root)")
        print(text, end="")
        return 0
    try:
        LDCONFIG_SNIPPET.write_text(text)
        subprocess.run(["ldconfig"], check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"hvgpu-guest ldconfig: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {LDCONFIG_SNIPPET} and ran ldconfig: programs now load {shim_dir}/libcuda.so.1 "
          f"(undo: rm {LDCONFIG_SNIPPET} && ldconfig)")
    return 0


def install_command(root: str) -> int:
    from hvgpu.guest.install import install

    try:
        said = install(root)
    except PermissionError as exc:
        print(f"hvgpu-guest install: {exc.filename}: permission denied (run it as root)",
              file=sys.stderr)
        return 1
    except (HvgpuError, OSError) as exc:
        print(f"hvgpu-guest install: {exc}", file=sys.stderr)
        return 1
    for line in said:
        print(line)
    return 0


def main(argv=None) -> int:
    """The command; a reader that goes away (EPIPE) ends it quietly with 128 + SIGPIPE,
    the status a shell reports for a program that SIGPIPE ended."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, where EPIPE is caught, not at exit, where it is not
        return code
    except BrokenPipeError:
        # Python would flush stdout again at exit and print that it could not: point
        # stdout at /dev/null first
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 128 + signal.SIGPIPE


def parser() -> argparse.ArgumentParser:
    """The command's definition: what it parses, and what its man page and shell
    completion are generated from."""
    ap = argparse.ArgumentParser(
        prog="hvgpu-guest", description="This VM's GPU slices, served by the host's hvgpu agent.",
        epilog=f"The agent is reached at ${ENV_ADDRESS}, else vsock://{P.HOST_CID}:"
               f"{P.DEFAULT_PORT} (the host seen from a VM).")
    ap.add_argument("--version", action="version", version=f"hvgpu-guest {__version__}")
    ap.add_argument("--agent", metavar="ADDR", help=f"agent address (overrides ${ENV_ADDRESS}): one per vGPU, "
                         "comma-separated, or one whose port + N reaches vGPU N")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="list this VM's vGPUs (memory = quota, compute share)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p = sub.add_parser("smi", help="an nvidia-smi-like view of the slice")
    p.add_argument("--json", action="store_true",
                   help="machine-readable output (what info --json prints)")
    p = sub.add_parser(
        "run", help="run a command with the libcuda shim in place",
        description="Run an unmodified CUDA program (static or shared cudart, cuBLAS, CuPy, "
                    "...) on this VM's vGPU: the command finds hvgpu's libcuda.so.1 first on "
                    "the library path, and its driver calls go to the host's agent.",
        epilog="example: hvgpu-guest run -- python3 -c 'import cupy; print(cupy.arange(3) * 2)'")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the command and its arguments")
    p = sub.add_parser("coverage", help="list the CUDA driver entry points the shim implements",
                       description="Every driver entry point CUDA 13.0's cuda.h declares, and "
                                   "whether the shim implements it.")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--missing", action="store_true", help="list only what is not implemented")
    p = sub.add_parser("ldconfig", help="make the shim the default libcuda.so.1 of this VM",
                       description=f"Print (or, with --write, install) {LDCONFIG_SNIPPET}, "
                                   "which puts the shim's directory first for the dynamic "
                                   "loader, so every program uses the vGPU without "
                                   "`hvgpu-guest run`.")
    p.add_argument("--write", action="store_true", help="write the file and run ldconfig (root)")
    p = sub.add_parser("install", help="give group hvgpu the VM's shared-memory device (root)",
                       description="Install the udev rule that gives group hvgpu read and "
                                   "write on the VM's shared-memory device (ivshmem, which "
                                   "carries the vGPU's bulk copies), create the group, and "
                                   "give it the devices present now.")
    p.add_argument("--root", default="/", metavar="DIR",
                   help="install the rule under DIR instead (an image being built); leaves "
                        "this system's group and devices alone")
    p = sub.add_parser("completion", help="print a shell completion script",
                       description="Print the completion script for SHELL, generated from "
                                   "this command's definition.",
                       epilog="bash: hvgpu-guest completion bash > "
                              "/etc/bash_completion.d/hvgpu-guest (or eval \"$(hvgpu-guest "
                              "completion bash)\" in ~/.bashrc); zsh: hvgpu-guest completion "
                              "zsh > ~/.zfunc/_hvgpu-guest; fish: hvgpu-guest completion fish "
                              "> ~/.config/fish/completions/hvgpu-guest.fish")
    p.add_argument("shell", choices=["bash", "zsh", "fish"])
    sub.add_parser("man", help="print this command's man page (roff: man -l <(hvgpu-guest man))",
                   description="Print the man page of hvgpu-guest, generated from this "
                               "command's definition, as roff: read it with man -l, or "
                               "install it as /usr/local/share/man/man1/hvgpu-guest.1.")
    return ap


def docs_command(what: str, shell: str | None = None) -> int:
    from hvgpu import clidoc

    cmd = clidoc.from_argparse(parser())
    if what == "man":
        print(clidoc.man_page(cmd, __version__, see_also=["hvgpu"]), end="")
    else:
        print(clidoc.COMPLETIONS[shell](cmd), end="")
    return 0


def _main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.command in ("man", "completion"):
        return docs_command(args.command, getattr(args, "shell", None))
    if args.command == "install":
        return install_command(args.root)
    if args.command == "run":
        cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        return run_command(cmd, args.agent)
    if args.command == "coverage":
        return coverage_command(args.json, args.missing)
    if args.command == "ldconfig":
        return ldconfig_command(args.write)
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
    if args.json:
        print(json.dumps(d, indent=2))
    else:
        print(info_text(d) if args.command == "info" else smi_text(d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
