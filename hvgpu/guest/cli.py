"""``hvgpu-guest``: what this VM's vGPU is, from inside the VM.

    hvgpu-guest info [--json]     the vGPU: name, memory (= quota), compute share
    hvgpu-guest smi [--json]      an nvidia-smi-like view of the slice and the VM's processes
        [-l SECONDS] [--query-gpu=FIELDS --format=csv[,noheader][,nounits]]
    hvgpu-guest run -- CMD ARGS   run an unmodified CUDA program on the vGPU (libcuda shim)
    hvgpu-guest coverage [--json] which CUDA driver entry points the shim implements
    hvgpu-guest ldconfig          make the shim this VM's libcuda.so.1 for every program
    hvgpu-guest install           give group hvgpu the VM's region device (udev rule)
    hvgpu-guest completion SHELL  a bash, zsh or fish completion script
    hvgpu-guest man               the man page (roff)

Every listing takes --json. Output into a pipe that closes early
(``hvgpu-guest coverage | head -2``) ends the command quietly, as it ends cat.
A click group, as ``hvgpu`` is: its man page and shell completion come from
this definition through hvgpu.clidoc, the same way as the host's. click is the
guest's one dependency outside the standard library (both distributions
require it); a VM without a package index installs it from a wheel carried in
beside hvgpu's (tests/vm does so). Must not import ``hvgpu.host``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
from click.shell_completion import CompletionItem

from hvgpu import __version__
from hvgpu.errors import CudaError, HvgpuError, TransportError
from hvgpu.guest import install as region_install
from hvgpu.guest.client import ENV_ADDRESS, Connection, default_address
from hvgpu.guest.device import Device
from hvgpu.virtio import protocol as P

PROG = "hvgpu-guest"
COMPLETE_VAR = "_HVGPU_GUEST_COMPLETE"  # click's: the completion script calls hvgpu-guest
#                                         back with it set


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def collect(agent: str | None = None) -> dict:
    """Everything ``info`` and ``smi`` show, as one dict: every vGPU of this VM."""
    address = default_address(0, agent)
    try:
        conn = Connection(address, monitor=True)
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
            with Connection(default_address(index, agent), monitor=True) as other:
                gpus.append(_vgpu(index, other)[1])
        except (HvgpuError, OSError) as exc:
            gpus.append({"index": index, "error": str(exc)})
    return {"agent": agent_version, "address": str(address), "peer": peer,
            "protocol": version, "vm": vm, "gpus": gpus, "region": region_devices()}


def region_devices() -> list[dict]:
    """The VM's region devices, and whether this user may map them."""
    return [{"address": d.address, "resource": str(d.resource), "size": d.size,
             "accessible": d.accessible()} for d in region_install.devices()]


def region_text(devices: list[dict]) -> list[str]:
    if not devices:
        return ["region: no device in this VM (bulk copies go over the socket)"]
    return [f"region: device {d['address']}, {_gib(d['size'])}, "
            + ("readable and writable by this user" if d["accessible"] else
               f"not accessible to this user ({d['resource']}: as root, `hvgpu-guest install`, "
               f"then join group {region_install.GROUP})") for d in devices]


def _vgpu(index: int, conn: Connection) -> tuple[str, dict]:
    """(the VM's name, what info and smi show of its vGPU ``index``)."""
    vm, quota, used, compute = conn.call("SLICE_INFO")
    dev = Device(connection=conn)
    major, minor = dev.compute_capability
    values = conn.call("DEVICE_GET_ATTRIBUTES", 0, max(_PCI_ATTRIBUTES))[0]
    domain, bus, device = (int.from_bytes(values[4 * (a - 1):4 * a], "little")
                           for a in _PCI_ATTRIBUTES)
    return vm, {"index": index, "address": str(conn.address), "name": dev.name,
                "uuid": dev.uuid, "memory_total": quota, "memory_used": used,
                "compute_share": compute, "multiprocessors": dev.multiprocessor_count,
                "compute_capability": f"{major}.{minor}",
                "pci_bus_id": f"{domain:08X}:{bus:02X}:{device:02X}.0",
                "driver_version": conn.call("DRIVER_GET_VERSION")[0],
                "utilization_gpu": _utilization(conn), "processes": _processes(conn)}


# CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, _PCI_BUS_ID, _PCI_DEVICE_ID: the bus id the CUDA
# shim gives (cuDeviceGetPCIBusId, from the same one-round-trip table, 0 where the driver
# has none), so that the listings agree
_PCI_ATTRIBUTES = (50, 33, 34)


def _utilization(conn: Connection) -> int | None:
    """The slice's GPU utilisation in percent; None where the host does not measure it
    (or is older than this command)."""
    try:
        known, gpu = conn.call("VGPU_UTILIZATION")
    except CudaError as exc:
        if exc.status == P.HV_UNKNOWN_OP:
            return None
        raise
    return gpu if known else None


def _processes(conn: Connection) -> list[dict] | None:
    """This VM's processes on the vGPU (pid as the VM numbers it, name, bytes held);
    None where the agent does not list them."""
    try:
        count, pids, used, names = conn.call("VGPU_PROCESSES")
    except CudaError as exc:
        if exc.status == P.HV_UNKNOWN_OP:
            return None
        raise
    names = names.split("\0") if count else []
    return [{"pid": int.from_bytes(pids[4 * i:4 * i + 4], "little"),
             "name": names[i] if i < len(names) else "",
             "used_memory": int.from_bytes(used[8 * i:8 * i + 8], "little")}
            for i in range(min(count, len(pids) // 4, len(used) // 8))]


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
    lines += region_text(d.get("region", []))
    return "\n".join(lines)


def _box(sections: list[tuple[list[str] | None, list[list[str]], set[int], int]]) -> str:
    """Tables stacked in one box, every line as wide as the widest: each section is
    (headers or None, rows, indexes of right-aligned columns, the column that widens);
    column widths come from the contents, and a narrower section's widening column
    takes up the rest."""
    natural = []
    for headers, rows, _, _ in sections:
        cols = [headers, *rows] if headers else rows
        widths = [max(len(r[i]) for r in cols) for i in range(len(cols[0]))]
        natural.append(widths)
    total = max(sum(w) + 3 * (len(w) - 1) for w in natural)
    lines: list[str] = []
    for (headers, rows, right, flex), widths in zip(sections, natural):
        widths = list(widths)
        widths[flex] += total - (sum(widths) + 3 * (len(widths) - 1))
        bar = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

        def line(cells, widths=widths, right=right):
            return "| " + " | ".join(c.rjust(w) if i in right else c.ljust(w)
                                     for i, (c, w) in enumerate(zip(cells, widths))) + " |"

        lines.append(bar)
        if headers:
            lines += [line(headers), bar]
        lines += [line(r) for r in rows]
    lines.append(lines[-len(sections[-1][1]) - (3 if sections[-1][0] else 1)])
    return "\n".join(lines)


def _util(g: dict) -> str:
    return "N/A" if g.get("utilization_gpu") is None else f"{g['utilization_gpu']}%"


def smi_text(d: dict) -> str:
    good = [g for g in d["gpus"] if "error" not in g]
    v = good[0]["driver_version"] if good else 0
    title = (f"hvgpu-guest {__version__}   {d['agent']}   CUDA driver {v // 1000}.{v % 1000 // 10}"
             f"   VM {d['vm'] or '(the whole GPU: host-local connection)'}")
    gpus = []
    for g in d["gpus"]:
        if "error" in g:
            gpus.append([str(g["index"]), "cannot be reached", "", "", "", "", ""])
            continue
        gpus.append([str(g["index"]), g["name"], g["pci_bus_id"],
                     f"{_gib(g['memory_used'])} / {_gib(g['memory_total'])}", _util(g),
                     f"{g['compute_share']}%" if g["compute_share"] else "time-shared",
                     g["compute_capability"]])
    procs = [[str(g["index"]), str(p["pid"]), p["name"] or "?", _gib(p["used_memory"])]
             for g in good for p in (g.get("processes") or [])]
    sections = [(None, [[title]], set(), 0),
                (["GPU", "Name", "Bus-Id", "Memory used / quota", "GPU-Util", "Compute",
                  "CC"], gpus, {0, 4, 5}, 1)]
    if procs:
        sections.append((["GPU", "PID", "Process name", "GPU Memory"], procs, {0, 1, 3}, 2))
    else:
        unknown = any(g.get("processes") is None for g in good)
        sections.append((["Processes"], [["the agent does not list processes" if unknown
                                          else "No running processes found"]], set(), 0))
    return _box(sections)


# nvidia-smi's --query-gpu fields that mean something for a vGPU: (unit, value of a vGPU)
QUERY_FIELDS = {
    "index": ("", lambda d, g: g["index"]),
    "count": ("", lambda d, g: len(d["gpus"])),
    "name": ("", lambda d, g: g["name"]),
    "uuid": ("", lambda d, g: g["uuid"]),
    "pci.bus_id": ("", lambda d, g: g["pci_bus_id"]),
    "driver_version": ("", lambda d, g: None),  # the host's display driver: not told to a VM
    "memory.total": ("MiB", lambda d, g: g["memory_total"] >> 20),
    "memory.used": ("MiB", lambda d, g: g["memory_used"] >> 20),
    "memory.free": ("MiB", lambda d, g: max(0, g["memory_total"] - g["memory_used"]) >> 20),
    "utilization.gpu": ("%", lambda d, g: g.get("utilization_gpu")),
    "compute_cap": ("", lambda d, g: g["compute_capability"]),
}
QUERY_ALIASES = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id",
                 "memory.total [MiB]": "memory.total"}


class UsageError(Exception):
    pass


def parse_query(fields: str, fmt: str) -> tuple[list[str], bool, bool]:
    """(fields, header, units) of --query-gpu FIELDS --format=csv[,noheader][,nounits]."""
    names = [f.strip() for f in fields.split(",") if f.strip()]
    unknown = [f for f in names if QUERY_ALIASES.get(f, f) not in QUERY_FIELDS]
    if unknown or not names:
        raise UsageError(f"--query-gpu: {'unknown field ' + ', '.join(unknown) if unknown else 'no field named'}"
                         f"; a vGPU answers: {', '.join(QUERY_FIELDS)}")
    opts = [o.strip() for o in (fmt or "").split(",")]
    if not opts or opts[0] != "csv" or set(opts[1:]) - {"noheader", "nounits"}:
        raise UsageError(f"--format={fmt or ''}: use --format=csv[,noheader][,nounits]")
    return names, "noheader" not in opts, "nounits" not in opts


def query_text(d: dict, names: list[str], header: bool, units: bool) -> str:
    lines = []
    if header:
        lines.append(", ".join(f"{n} [{QUERY_FIELDS[QUERY_ALIASES.get(n, n)][0]}]"
                               if units and QUERY_FIELDS[QUERY_ALIASES.get(n, n)][0] else n
                               for n in names))
    for g in d["gpus"]:
        cells = []
        for n in names:
            unit, value = QUERY_FIELDS[QUERY_ALIASES.get(n, n)]
            got = value(d, g) if "error" not in g or n in ("index", "count") else None
            cells.append("[N/A]" if got is None else
                         f"{got} {unit}" if units and unit else str(got))
        lines.append(", ".join(cells))
    return "\n".join(lines)


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
    from hvgpu.guest.shim import ShimMissing, coverage, needed_by

    try:
        rows = coverage()
    except ShimMissing as exc:
        print(f"hvgpu-guest coverage: {exc}", file=sys.stderr)
        return 1
    names: dict[str, bool] = {}
    for api, _symbol, implemented in rows:
        names[api] = names.get(api, False) or implemented
    needed = {api: programs for api, programs in needed_by().items() if not names.get(api, True)}
    if as_json:
        print(json.dumps({"implemented": sorted(a for a, ok in names.items() if ok),
                          "not_implemented": sorted(a for a, ok in names.items() if not ok),
                          "needed_by": needed}, indent=2))
        return 0
    for api in sorted(names):
        if not (missing_only and names[api]):
            line = f"{'yes' if names[api] else 'no ':4} {api}"
            if api in needed:
                line += f"  needed by {', '.join(needed[api])}"
            print(line)
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
    text = (f"# hvgpu: the vGPU's libcuda.so.1 and libnvidia-ml.so.1 (hvgpu-guest ldconfig)\n"
            f"{shim_dir}\n")
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
          f"and libnvidia-ml.so.1 (undo: rm {LDCONFIG_SNIPPET} && ldconfig)")
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


def smi_command(agent: str | None, as_json: bool, loop: float | None, query_gpu: str | None,
                fmt: str | None) -> int:
    """smi once, or every -l SECONDS until Ctrl-C (which ends it with status 0)."""
    query = None
    try:
        if query_gpu is not None:
            query = parse_query(query_gpu, fmt)
        elif fmt is not None:
            raise UsageError("--format goes with --query-gpu=FIELDS")
        if loop is not None and not 0 < loop <= 86400:
            raise UsageError(f"-l {loop:g}: give a number of seconds above 0")
    except UsageError as exc:
        print(f"hvgpu-guest smi: {exc}", file=sys.stderr)
        return 2
    first = True
    try:
        while True:
            d = _collect_or_say(agent)
            if d is None:
                return 1
            if as_json:
                print(json.dumps(d, indent=2))
            elif query is not None:
                names, header, units = query
                print(query_text(d, names, header and first, units))
            else:
                print(smi_text(d) + ("\n" if loop else ""))
            sys.stdout.flush()
            if loop is None:
                return 0
            first = False
            time.sleep(loop)
    except KeyboardInterrupt:
        return 0


def _collect_or_say(agent: str | None) -> dict | None:
    """collect(), or None once the reason is on stderr."""
    try:
        return collect(agent)
    except CudaError as exc:
        if exc.status == P.HV_NO_SLICE:
            print(f"hvgpu-guest: no GPU slice is attached to this VM: {exc}", file=sys.stderr)
        else:
            print(f"hvgpu-guest: error: {exc}", file=sys.stderr)
    except HvgpuError as exc:
        print(f"hvgpu-guest: {exc}", file=sys.stderr)
    return None


# ---- the command line ------------------------------------------------------------------

@contextlib.contextmanager
def _reader_gone():
    """A reader that goes away (EPIPE) ends the command quietly with 128 + SIGPIPE, the
    status a shell reports for a program that SIGPIPE ended (click's own ending says 1)."""
    try:
        yield
    except BrokenPipeError:
        # Python would flush stdout again at exit and print that it could not: point
        # stdout at /dev/null first
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        raise click.exceptions.Exit(128 + signal.SIGPIPE) from None


class _Group(click.Group):
    """hvgpu-guest's subcommands, listed in the order they are defined here; an unknown
    one is refused with the list; see _reader_gone for a pipe that closes early."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)

    def resolve_command(self, ctx: click.Context, args: list[str]):
        name = args[0]
        if self.get_command(ctx, name) is None and not ctx.resilient_parsing \
                and not name.startswith("-"):
            raise click.UsageError(f"No such command {name!r}: the commands are "
                                   f"{', '.join(self.list_commands(ctx))}.", ctx)
        return super().resolve_command(ctx, args)

    def make_context(self, *args, **kwargs) -> click.Context:
        with _reader_gone():  # --help into a closed pipe
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: click.Context):
        with _reader_gone():
            code = super().invoke(ctx)
            sys.stdout.flush()  # here, where EPIPE is caught, not at exit, where it is not
            return code


def _json_option(help_: str):
    return click.option("--json", "as_json", is_flag=True, help=help_)


def _complete_command(ctx: click.Context, param: click.Parameter,
                      incomplete: str) -> list[CompletionItem]:
    """run's command line: a program on PATH, then files (as a shell completes after
    sudo or env)."""
    if ctx.params.get(param.name) or "/" in incomplete:
        return [CompletionItem(incomplete, type="file")]
    names = set()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        try:
            with os.scandir(directory or ".") as entries:
                names.update(e.name for e in entries if e.name.startswith(incomplete)
                             and not e.is_dir() and os.access(e.path, os.X_OK))
        except OSError:
            continue
    return [CompletionItem(n) for n in sorted(names)]


def _complete_dir(ctx, param, incomplete: str) -> list[CompletionItem]:
    return [CompletionItem(incomplete, type="dir")]


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]},
             no_args_is_help=False,  # "Missing command", status 2, in every click 8
             epilog=f"The agent is reached at ${ENV_ADDRESS}, else vsock://{P.HOST_CID}:"
                    f"{P.DEFAULT_PORT} (the host seen from a VM).")
@click.version_option(__version__, "--version", prog_name=PROG,
                      message="%(prog)s %(version)s")
@click.option("--agent", metavar="ADDR", default=None,
              help=f"agent address (overrides ${ENV_ADDRESS}): one per vGPU, comma-separated, "
                   "or one whose port + N reaches vGPU N")
@click.pass_context
def cli(ctx: click.Context, agent: str | None) -> None:
    """This VM's GPU slices, served by the host's hvgpu agent."""
    ctx.obj = agent


@cli.command("info", short_help="list this VM's vGPUs (memory = quota, compute share)")
@_json_option("machine-readable output")
@click.pass_obj
def _info(agent: str | None, as_json: bool) -> int:
    """List this VM's vGPUs: name, memory (= quota) and what is in use, compute share,
    SMs, compute capability and UUID; then the VM's region device, and whether
    this user may map it."""
    d = _collect_or_say(agent)
    if d is None:
        return 1
    print(json.dumps(d, indent=2) if as_json else info_text(d))
    return 0


@cli.command("smi", short_help="an nvidia-smi-like view of the slice",
             epilog="\b\nexample: hvgpu-guest smi --query-gpu=index,name,memory.used,"
                    "memory.total --format=csv,noheader -l 5")
@_json_option("machine-readable output (what info --json prints)")
@click.option("-l", "--loop", type=float, metavar="SECONDS",
              help="show it again every SECONDS until Ctrl-C")
@click.option("--query-gpu", metavar="FIELDS",
              help=f"comma-separated fields, as nvidia-smi names them: "
                   f"{', '.join(QUERY_FIELDS)} (needs --format=csv)")
@click.option("--format", "fmt", metavar="csv[,noheader][,nounits]",
              help="the output of --query-gpu")
@click.pass_obj
def _smi(agent: str | None, as_json: bool, loop: float | None, query_gpu: str | None,
         fmt: str | None) -> int:
    """This VM's vGPUs as nvidia-smi shows GPUs: memory (= quota) and use, the slice's
    utilisation where the host measures it, and the VM's processes on each vGPU."""
    return smi_command(agent, as_json, loop, query_gpu, fmt)


# Options end at the command's name: `run prog --help -l 5` gives prog its own options
# (and `run -- --prog` a name that starts with a dash)
@cli.command("run", short_help="run a command with the libcuda shim in place",
             context_settings={"allow_interspersed_args": False},
             epilog="\b\nexample: hvgpu-guest run -- python3 -c 'import cupy; "
                    "print(cupy.arange(3) * 2)'")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[--] CMD [ARGS]...",
                shell_complete=_complete_command)
@click.pass_obj
def _run(agent: str | None, command: tuple[str, ...]) -> int:
    """Run an unmodified CUDA program (static or shared cudart, cuBLAS, CuPy, ...) on
    this VM's vGPU: the command finds hvgpu's libcuda.so.1 (and libnvidia-ml.so.1, for
    NVML tools) first on the library path, and its driver calls go to the host's agent.
    Its exit status is the program's own."""
    return run_command(list(command), agent)


@cli.command("coverage", short_help="list the CUDA driver entry points the shim implements")
@_json_option("machine-readable output")
@click.option("--missing", is_flag=True, help="list only what is not implemented")
def _coverage(as_json: bool, missing: bool) -> int:
    """Every driver entry point CUDA 13.0's cuda.h declares, and whether the shim
    implements it."""
    return coverage_command(as_json, missing)


@cli.command("ldconfig", short_help="make the shim the default libcuda.so.1 of this VM",
             help=f"Print (or, with --write, install) {LDCONFIG_SNIPPET}, which puts the "
                  "shim's directory first for the dynamic loader, so every program uses the "
                  "vGPU without `hvgpu-guest run`.")
@click.option("--write", is_flag=True, help="write the file and run ldconfig (root)")
def _ldconfig(write: bool) -> int:
    return ldconfig_command(write)


@cli.command("install", short_help="give group hvgpu the VM's region device (root)")
@click.option("--root", default="/", metavar="DIR", shell_complete=_complete_dir,
              help="install the rule under DIR instead (an image being built); leaves this "
                   "system's group and devices alone")
def _install(root: str) -> int:
    """Install the udev rule that gives group hvgpu read and write on the VM's
    region device (ivshmem, which carries the vGPU's bulk copies), create the
    group, and give it the devices present now."""
    return install_command(root)


@cli.command("completion", short_help="print a shell completion script",
             epilog="\b\nbash: hvgpu-guest completion bash > "
                    "~/.local/share/bash-completion/completions/hvgpu-guest\n"
                    "      (or: eval \"$(hvgpu-guest completion bash)\" in ~/.bashrc)\n"
                    "zsh:  hvgpu-guest completion zsh > ~/.zfunc/_hvgpu-guest   "
                    "(~/.zfunc on $fpath)\n"
                    "fish: hvgpu-guest completion fish > "
                    "~/.config/fish/completions/hvgpu-guest.fish")
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def _completion(shell: str) -> int:
    """Print the completion script for SHELL: click's, from this command's definition
    (subcommands, options and their choices), as hvgpu's. The script calls hvgpu-guest
    back to complete, so it must be on PATH."""
    from hvgpu.clidoc import completion_script

    print(completion_script(cli, PROG, COMPLETE_VAR, shell))
    return 0


@cli.command("man", short_help="print this command's man page (roff: man -l <(hvgpu-guest man))")
def _man() -> int:
    """Print the man page of hvgpu-guest, generated from this command's definition, as
    roff: read it with man -l, or install it as /usr/local/share/man/man1/hvgpu-guest.1."""
    from hvgpu.clidoc import from_click, man_page

    print(man_page(from_click(cli, PROG), __version__, see_also=["hvgpu"]), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command; returns its exit status (the script exits with it)."""
    try:
        code = cli.main(args=argv, prog_name=PROG, complete_var=COMPLETE_VAR,
                        standalone_mode=False)
    except click.ClickException as exc:  # a usage error: status 2, as click says it
        exc.show()
        return exc.exit_code
    except click.Abort:  # Ctrl-C (smi -l ends on it with 0 itself)
        return 128 + signal.SIGINT
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
