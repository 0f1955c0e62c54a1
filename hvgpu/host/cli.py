"""The ``hvgpu`` command line (host side).

A thin adapter: it parses and prints, and leaves the work to the agent and
the guest API. Expected errors (``HvgpuError.expected``) are printed as one
line and exit 1; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys

try:
    import click
except ImportError:  # an install without its dependencies (click is the guest's too)
    sys.stderr.write("hvgpu: the host commands need the host install: pip install "
                     "'hvgpu[host]'; in a VM, use hvgpu-guest\n")
    raise SystemExit(1) from None

from hvgpu import __version__
from hvgpu.errors import HvgpuError, report
from hvgpu.host.names import MAX_VGPUS
from hvgpu.host.state import MAX_CID
from hvgpu.units import SHARE_FORMS, SIZE_FORMS, format_size, parse_size
from hvgpu.virtio.protocol import DEFAULT_PORT

MAX_VCPUS = 255  # x2APIC IDs above 254 need an IOMMU with interrupt remapping, which
#                  the domain domain-xml prints does not have
TEST_URI = "test:///default"
DEFAULT_CONFIG = "/etc/hvgpu/agent.toml"  # agent_config.DEFAULT_PATH (no import at start)


# Exit statuses besides 0 (done), 1 (refused or failed: not done) and 2 (click's: a
# usage error, nothing asked of the agent).
EXIT_UNKNOWN = 3  # a change reached the agent and no reply came: done or not, unknown


def _fail(exc: HvgpuError):
    status = report(exc, "hvgpu")
    sys.exit(EXIT_UNKNOWN if exc.code == "outcome-unknown" else status)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hvgpu")
@click.option("--control", metavar="PATH", envvar="HVGPU_CONTROL", default=None,
              help="The agent's control socket [default: /run/hvgpu/control.sock as root]. "
                   "May follow the command too (hvgpu list --control PATH).")
@click.option("-c", "--connect", metavar="URI", envvar="LIBVIRT_DEFAULT_URI",
              default="qemu:///system", show_default=True,
              help="libvirt URI the agent manages VMs through (as virsh has it). `agent` "
                   "manages that libvirt's VMs, `systemd-unit` writes it into the unit, "
                   "`demo --vm` uses that libvirt's domain; given here, the commands that "
                   "talk to a running agent (gpus, attach, detach, resize, list, status) "
                   "are refused when that agent manages another libvirt's VMs; domain-xml "
                   "and demo without --vm use no libvirt of yours and refuse it. May follow "
                   "the command too (hvgpu agent --connect URI).")
@click.pass_context
def cli(ctx, control, connect):
    """GPU sharing for libvirt/KVM hosts.

    The host agent owns the NVIDIA GPUs and cuts them into slices (a memory
    quota and a compute share); a VM's CUDA calls reach it over virtio-vsock
    and run on its slice.

    \b
    Start here:
      hvgpu demo                              run a checked CUDA workload
      hvgpu agent                             serve guests on vsock port 5170
      hvgpu attach vm1 --mem 4G --cid 3       give the VM with CID 3 a 4 GiB slice
      hvgpu status                            what each slice uses

    \b
    Exit status:
      0  done
      1  an error: refused, or failed
      2  a usage error: nothing was asked of the agent
      3  attach, detach or resize reached the agent and no reply came (it
         stopped or did not answer in time): whether it was done is unknown;
         hvgpu list shows what the agent holds once it answers again
    """
    given = ctx.get_parameter_source("connect") == click.core.ParameterSource.COMMANDLINE
    ctx.obj = {"control": control, "connect": connect, "connect_given": given}


def _after_command(name: str):
    """An option of ``hvgpu`` itself (--connect, --control) that may also be given after
    the command (``hvgpu agent --connect URI`` as ``hvgpu --connect URI agent``): the
    value goes where the group's would; the same option given in both places with
    different values is refused."""
    def callback(ctx, param, value):
        source = ctx.get_parameter_source(param.name)
        if value is None or source != click.core.ParameterSource.COMMANDLINE:
            return
        obj = ctx.obj
        group = ctx.find_root()
        before = group.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
        if before and obj[name] != value:
            raise click.BadParameter(f"{value!r}, while `hvgpu --{name} {obj[name]}` gives "
                                     "another before the command: give it once")
        obj[name] = value
        if name == "connect":
            obj["connect_given"] = True
    return callback


def _connect_option(f):
    return click.option("-c", "--connect", metavar="URI", default=None, expose_value=False,
                        callback=_after_command("connect"),
                        help="As hvgpu --connect URI (given before or after the command).")(f)


def _control_option(f):
    return click.option("--control", metavar="PATH", default=None, expose_value=False,
                        callback=_after_command("control"),
                        help="As hvgpu --control PATH (given before or after the command).")(f)


def _agent_options(f):
    """--connect and --control after a command that talks to a running agent."""
    return _connect_option(_control_option(f))


def _refuse_connect(ctx, why: str) -> None:
    """-c given for a command that uses no libvirt of the operator's: refused, not ignored."""
    if ctx.obj["connect_given"]:
        _fail(HvgpuError(f"-c/--connect does not apply to `{ctx.info_name}`: {why}"))


def _client(ctx):
    from hvgpu.host.control_grpc import ControlClient

    return ControlClient(ctx.obj["control"])


def _call(ctx, name, **kwargs):
    """One call to the agent; with -c given, the agent must manage that libvirt's VMs."""
    if ctx.obj["connect_given"]:
        kwargs["connect"] = ctx.obj["connect"]
    try:
        result = _client(ctx).call(name, **kwargs)
    except HvgpuError as exc:
        _fail(exc)
    if isinstance(result, dict) and result.get("warning"):
        click.echo(f"hvgpu: WARNING: {result['warning']}", err=True)
    return result


def _emit(data, as_json: bool, text) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(text(data))


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _share(pct: int, enforced: bool | None = None) -> str:
    """A compute share as every command shows it; one MPS does not enforce says so."""
    if not pct:
        return "time-shared"
    return f"{pct}%" + (" (not enforced)" if enforced is False else "")


def _percent(value: int | None) -> str:
    """A utilisation: N/A where NVML has no figure (as nvidia-smi and hvgpu-guest smi)."""
    return "N/A" if value is None else f"{value}%"


def _cid(s) -> str:
    """The VM's vsock CID: the one it was attached with, else the one libvirt gave it."""
    cid = s["cid"] if s.get("cid") is not None else s.get("vsock_cid")
    return "-" if cid is None else str(cid)


def _slice_rows(slices, extra=()):
    rows = [["VM", "DEVICE", "GPU", "MEMORY", "COMPUTE", "REGION", "CID", *[h for h, _ in extra]]]
    for s in slices:
        rows.append([s["vm"], str(s.get("device", 0)), str(s["gpu_index"]), format_size(s["mem"]),
                     _share(s["compute"], s.get("compute_enforced")),
                     format_size(s["region"]) if s.get("region") else "-",
                     _cid(s), *[f(s) for _, f in extra]])
    return rows


_REGION_HELP = ("A region of SIZE per vGPU (host memory that the VM and its executor both "
                "map), for the VM's bulk data: CUDA programs in the VM get their pinned host "
                "memory (cudaMallocHost) and their copy staging from it, and copies through "
                "it are DMA on the host. A power of two from 1M to 1T (1M, 2M, ... 512M, 1G, "
                "2G); host RAM in /dev/shm, not GPU memory, and SIZE is its limit. A libvirt "
                "domain gets an ivshmem-plain device for it.")


_json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")

# Options renamed since an earlier version: the earlier name is still accepted, hidden
# from --help and the completion, so scripts, units and agent.toml files that use it
# keep working.
_SOURCE_RANK = {click.core.ParameterSource.DEFAULT: 0, click.core.ParameterSource.DEFAULT_MAP: 1}


def _earlier_name(old: str, name: str, callback=None):
    """A hidden option ``old``: what option ``name`` was called before (see _renamed)."""
    return click.option(old, name + "_earlier", default=None, hidden=True, callback=callback)


def _renamed(ctx, name: str) -> object:
    """Option ``name``'s value, or its earlier name's where that was given more directly
    (command line over agent.toml over the default); the two given alike must agree."""
    value, earlier = ctx.params[name], ctx.params[name + "_earlier"]
    if earlier is None:
        return value
    rank, rank_earlier = (_SOURCE_RANK.get(ctx.get_parameter_source(n), 2)
                          for n in (name, name + "_earlier"))
    if rank == rank_earlier and value != earlier:
        new, old = (next(p.opts[0] for p in ctx.command.params if p.name == n)
                    for n in (name, name + "_earlier"))
        raise click.UsageError(f"{new} {value} and {old} {earlier} (its earlier name) "
                               "disagree: give one", ctx)
    return earlier if rank_earlier >= rank else value

_MEM_RANGE = "from 1M (the driver takes a quota in whole MiB) to the largest GPU's memory"
_MEM_HELP = f"Memory quota: {SIZE_FORMS}; {_MEM_RANGE}."
_COMPUTE_HELP = (f"Share of the GPU's SMs: {SHARE_FORMS}. Enforced by MPS; where MPS does "
                 "not run, refused unless --allow-time-shared")
_TIME_SHARED_HELP = ("Take a --compute share even where MPS does not run to enforce it (the "
                     "share is recorded, and the VM's kernels time-share the GPU); a warning "
                     "is printed and logged.")
_VM_ARG_HELP = "VM is a libvirt domain's name or UUID, or the name a VM was attached by."


def _checked(parse):
    """An option callback: the value as typed, once ``parse`` accepts it (the agent parses
    it again), so a bad one is refused here even without an agent."""
    def callback(ctx, param, value):
        if value in (None, ""):
            return value
        try:
            parse(value)
        except HvgpuError as exc:
            raise click.BadParameter(str(exc)) from None
        return value
    return callback


def _mem(text):
    from hvgpu.units import parse_mem

    return parse_mem(text)


def _region(text):
    from hvgpu.units import parse_region_size

    return parse_region_size(text)


def _compute(text):
    from hvgpu.units import parse_share

    return parse_share(text)


def _vm_name(ctx, param, value):
    """A VM name, checked by the rules the agent and libvirt apply (names.check_vm_name),
    so that what one command takes another does not refuse."""
    from hvgpu.host.names import check_vm_name

    try:
        return check_vm_name(value)
    except HvgpuError as exc:
        raise click.BadParameter(str(exc)) from None


def _vcpus_option(ctx, param, value):
    if not 1 <= value <= MAX_VCPUS:
        raise click.BadParameter(
            f"{value}: a domain has 1 to {MAX_VCPUS} virtual CPUs (more need an IOMMU with "
            "interrupt remapping, which this domain does not have)")
    return value


def _cid_option(ctx, param, value):
    if value is None:
        return None
    if not 3 <= value <= MAX_CID:
        raise click.BadParameter(
            f"{value} is not a guest's CID: a VM's vsock CID is 3 to {MAX_CID} (0 is the "
            f"hypervisor, 1 this host's loopback, 2 the host; {MAX_CID + 1} means any)")
    return value


def _local_region(text: str) -> int:
    if text.strip() == "0":
        return 0
    try:
        return parse_size(text)
    except (HvgpuError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="--local-region") from None


def _config_option(ctx, param, value):
    """--config (eager): the file's values become the agent's defaults."""
    from hvgpu.host.agent_config import apply

    if not ctx.resilient_parsing:
        apply(ctx, value)


def _print_config(ctx, param, value):
    from hvgpu.host.agent_config import example

    if value and not ctx.resilient_parsing:
        click.echo(example(ctx))
        ctx.exit()


def _ready_status(runner, control: str) -> str:
    """The line `systemctl status` shows while the agent serves."""
    listeners = ", ".join(str(listener.address) for listener in runner.router.listeners)
    slices = len(runner.slices.list()) if runner.slices is not None else 0
    return f"serving {slices} slices on {listeners or 'no listener'}; control {control}"


def _metrics_address(text):
    from hvgpu.host.metrics import parse_address

    return parse_address(text)


@cli.command()
@click.option("--listen", "listen", multiple=True, metavar="ADDR[=VM]",
              help="Also listen on ADDR (repeatable): unix:///path, "
                   "hvsock:///path/vm.vsock:PORT, tcp://HOST:PORT. With =VM, connections "
                   "there belong to VM's slice (=VM#N: its vGPU N); without, each gets the "
                   "whole GPU (host-local use).")
@click.option("--vsock-port", type=click.IntRange(1, 2 ** 32 - 1 - MAX_VGPUS),
              default=DEFAULT_PORT, show_default=True,
              help="vsock port guests connect to (host CID 2); vGPU N of a VM at PORT + N.")
@click.option("--no-vsock", is_flag=True, help="Do not listen on vsock.")
@click.option("--gpu", type=int, default=0, show_default=True,
              help="CUDA ordinal of the GPU that executors use.")
@click.option("--cache-dir", default=None, metavar="DIR",
              help="Where compiled CUDA C++ modules are cached "
                   "[default: /var/cache/hvgpu as root, else ~/.cache/hvgpu].")
@click.option("--state-dir", default=None, metavar="DIR",
              help="Where slices persist [default: /var/lib/hvgpu as root, else "
                   "~/.local/state/hvgpu].")
@click.option("--control-group", default=None, metavar="GROUP",
              help="Let GROUP use the control socket too (default: root only); a group "
                   "the executor user is in is refused.")
@click.option("--no-mps", is_flag=True,
              help="Do not start MPS: memory is enforced by accounting, compute time-shared.")
@click.option("--placement", default="best-fit", show_default=True,
              type=click.Choice(["best-fit", "pack", "spread"]),
              help="How attach chooses a GPU: best-fit (least memory left over), pack (lowest "
                   "index first), spread (most free memory).")
@click.option("--max-connections-per-vm", type=click.IntRange(min=1), default=64,
              show_default=True, metavar="N",
              help="Open connections a VM may have at once, over all its vGPUs; more are "
                   "refused with HVGPU_ERROR_TOO_MANY_CONNECTIONS.")
@click.option("--local-region", default="1G", show_default=True, metavar="SIZE",
              help="Regions (memfds) each connection on a listener bound to no VM may "
                   "have its executor map and page-lock, for its pinned memory and copy "
                   "staging; 0: none. A VM's is its slice's (attach --region).")
@_earlier_name("--local-shm", "local_region")
@click.option("--executor-user", default="hvgpu", show_default=True, metavar="NAME",
              help="Run executors (the processes that run guests' CUDA work) as this user, "
                   "without capabilities; install.sh creates it. `root` runs them as root, "
                   "unconfined by uid. Ignored when the agent is not root.")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@click.option("--log-format", default="auto", show_default=True,
              type=click.Choice(["auto", "text", "journal", "json"], case_sensitive=False),
              help="Log lines of the agent and its executors: text (with the time), journal "
                   "(no time of our own, each line's priority as <N> for journald), json (one "
                   "object a line: time, level, logger, source, message, extra fields); auto: "
                   "journal when stderr is systemd's journal, else text.")
@click.option("--metrics", default=None, metavar="HOST:PORT",
              callback=_checked(_metrics_address),
              help="Serve Prometheus metrics at http://HOST:PORT/metrics, for example "
                   "127.0.0.1:9464 [default: off]. 0.0.0.0 shows every VM's name and "
                   "usage to anyone who can reach the port.")
@click.option("--config", metavar="PATH", default=None, is_eager=True, expose_value=False,
              callback=_config_option,
              help=f"Read options from this TOML file [default: {DEFAULT_CONFIG}, if it "
                   "exists]; keys are the long option names (vsock-port = 5170), and the "
                   "command line overrides them. --print-config shows every key.")
@click.option("--print-config", is_flag=True, is_eager=True, expose_value=False,
              callback=_print_config,
              help="Print a commented configuration file with every key and its default; "
                   "exit.")
@_agent_options
@click.pass_context
def agent(ctx, listen, vsock_port, no_vsock, gpu, cache_dir, state_dir, control_group, no_mps,
          placement, max_connections_per_vm, local_region, local_region_earlier, executor_user,
          log_level, log_format, metrics):
    """Run the host agent in the foreground until SIGINT/SIGTERM.

    Guests connect over vsock; a guest is identified by its CID (never by what
    it claims) and served by its slice's executor: one MPS client per slice,
    started with the slice's memory quota and compute share. The control
    socket serves the other hvgpu commands.

    \b
    Examples:
      hvgpu agent
      hvgpu agent --no-vsock --listen unix:///run/hvgpu/data.sock
      hvgpu agent --listen hvsock:///run/firecracker/vm1.vsock:5170=vm1
    """
    from hvgpu.host.agent import Agent, AgentConfig, default_cache_dir, default_state_dir
    from hvgpu.host.spawn import default_run_dir
    from hvgpu.host.control_api import ControlAPI
    from hvgpu.host.control_grpc import default_socket, serve
    from hvgpu.host.inventory import read_gpus

    from hvgpu.host import logs, sdnotify

    local_region = _renamed(ctx, "local_region")
    log_format = logs.setup(log_level, log_format, "agent")
    if control_group:  # before anything starts
        from hvgpu.host.control_grpc import check_group
        from hvgpu.host.spawn import resolve_user

        try:
            check_group(control_group, resolve_user(executor_user))
        except HvgpuError as exc:
            _fail(exc)
    systemd = sdnotify.claim()  # taken out of the environment: no child inherits it
    config = AgentConfig(listen=list(listen), vsock_port=None if no_vsock else vsock_port,
                         gpu=gpu, cache_dir=cache_dir or default_cache_dir(),
                         state_dir=state_dir or default_state_dir(), mps=not no_mps,
                         log_level=log_level.upper(), log_format=log_format,
                         connect=ctx.obj["connect"],
                         placement=placement, max_connections_per_vm=max_connections_per_vm,
                         executor_user=executor_user, run_dir=default_run_dir(),
                         local_region=_local_region(local_region), metrics=metrics)
    try:
        runner = Agent(config, gpus=read_gpus)
        runner.start()
    except HvgpuError as exc:
        _fail(exc)
    path = ctx.obj["control"] or default_socket()
    try:
        server = serve(runner.commands(ControlAPI(runner, read_gpus)), path, control_group)
    except BaseException as exc:
        runner.stop()
        runner.serve_forever()  # returns at once: closes what start opened, socket files too
        if isinstance(exc, HvgpuError):
            _fail(exc)
        raise
    logging.getLogger("hvgpu").info("control lane on unix://%s", path)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: runner.stop())
    if systemd:
        sdnotify.ready(_ready_status(runner, path))
    try:
        runner.serve_forever()
    finally:
        server.stop(2)


@cli.command()
@_json_option
@_agent_options
@click.pass_context
def gpus(ctx, as_json):
    """List the host's GPUs, what is reserved on each and how slices are enforced.

    \b
    Example:
      hvgpu gpus --json
    """
    def text(data):
        rows = [["GPU", "NAME", "MEMORY", "RESERVED", "COMPUTE RESERVED", "UTIL", "UUID"]]
        for g in data:
            rows.append([str(g["index"]), g["name"], format_size(g["memory_total"]),
                         format_size(g["reserved_mem"]) if g["reserved_mem"] else "0",
                         f"{g['reserved_compute']}%",
                         _percent(g["utilization"]), g["uuid"]])
        notes = "\n".join(f"GPU {g['index']}: {g['enforcement']}" for g in data)
        return _table(rows) + "\n\n" + notes
    _emit(_call(ctx, "gpus"), as_json, text)


@cli.command()
@click.argument("vm", callback=_vm_name)
@click.option("--mem", required=True, metavar="SIZE", help=_MEM_HELP, callback=_checked(_mem))
@click.option("--compute", default=None, metavar="SHARE", callback=_checked(_compute),
              help=_COMPUTE_HELP + " [default: none reserved, time-shared].")
@click.option("--allow-time-shared", is_flag=True, help=_TIME_SHARED_HELP)
@click.option("--gpu", default=None, metavar="N|UUID",
              help="Place on this GPU [default: the agent's placement policy].")
@click.option("--placement", default=None, type=click.Choice(["best-fit", "pack", "spread"]),
              help="Choose the GPU by this policy instead of the agent's (see hvgpu agent --help).")
@click.option("--cid", type=int, default=None, metavar="N", callback=_cid_option,
              help=f"The VM's vsock CID, for VMs that libvirt does not manage "
                   f"(Firecracker, Cloud Hypervisor, plain QEMU): 3 to {MAX_CID}, and no "
                   "other VM's (another slice's, or one libvirt gave a running domain).")
@click.option("--count", type=click.IntRange(1, 8), default=1, show_default=True,
              help="How many vGPUs, each with --mem and --compute, on distinct GPUs "
                   "(unless --gpu names one); the guest sees devices 0..COUNT-1.")
@click.option("--add", is_flag=True,
              help="VM already has vGPUs: attach more after them (its next device numbers).")
@click.option("--region", default=None, metavar="SIZE", help=_REGION_HELP + " [default: none]",
              callback=_checked(_region))
@_earlier_name("--shm", "region", _checked(_region))
@_json_option
@_agent_options
@click.pass_context
def attach(ctx, vm, mem, compute, allow_time_shared, gpu, cid, placement, count, add, region,
           region_earlier, as_json):
    """Give VM a GPU slice (a vGPU); it applies to the VM's next CUDA connection.

    VM is a libvirt domain's name or UUID: a domain without a vsock device
    gets one (hot-plugged, live and in its config), and the slice is written
    into the domain's metadata (virsh dumpxml shows it). A domain whose guest
    reaches the agent through a hybrid-vsock listener bound to it (hvgpu agent
    --listen hvsock://UDS:5170=VM; see hvgpu domain-xml --vhost-user-vsock)
    gets no vsock device, only the metadata.

    With --region, each new vGPU also gets a region: in a libvirt
    domain an ivshmem-plain device <shmem name='hvgpu-VM'> (hvgpu-VM#N for
    vGPU N), hot-plugged beside the vsock device (live and in its config; a
    hybrid-vsock domain gets it too), backed by /dev/shm/hvgpu-VM, which QEMU
    creates. The guest maps the device's BAR 2.

    A VM may have several vGPUs (--count, or --add later), each served by its
    own executor on its GPU; the guest reaches vGPU N at the data lane's vsock
    port + N, which hvgpu-guest does by itself.

    \b
    Examples:
      hvgpu attach vm1 --mem 4G
      hvgpu attach vm2 --mem 8G --compute 25% --gpu 1
      hvgpu attach vm3 --mem 16G --count 2
      hvgpu attach vm1 --mem 4G --add
      hvgpu attach vm4 --mem 4G --region 1G
      hvgpu attach fc-vm --mem 2G --cid 3
      hvgpu attach 5a0e33c4-7d2b-4f7e-9c1a-2b3c4d5e6f70 --mem 1.5G

    Sizes need a unit (4 alone is refused): K, M, G, T and KiB, MiB, GiB,
    TiB are powers of 1024 (1G = 1024M). A compute share is 25% or 0.25;
    where MPS does not run it cannot be enforced, and is refused unless
    --allow-time-shared is given.
    """
    region = _renamed(ctx, "region")
    s = _call(ctx, "attach", vm=vm, mem=mem, compute=compute, gpu=gpu, cid=cid,
              placement=placement, count=count if count != 1 else None, add=add or None,
              region=region, allow_time_shared=allow_time_shared or None)

    def text(s):
        line = f"attached {s['vm']}: " + "; ".join(
            (f"device {v['device']}: " if len(s["vgpus"]) > 1 or v["device"] else "")
            + f"{format_size(v['mem'])}, compute "
            + _share(v["compute"], v.get("compute_enforced"))
            + f", GPU {v['gpu_index']} ({v['gpu_uuid']})"
            + (f", region {format_size(v['region'])}" if v.get("region") else "")
            for v in s["vgpus"])
        if "hybrid_vsock" in s:
            line += f", served by the hybrid-vsock listener {s['hybrid_vsock']} (no vsock " \
                    "device hot-plugged)"
        if "vsock_cid" in s:
            line += (f", vsock CID {s['vsock_cid']}" if s["vsock_cid"] is not None
                     else ", vsock CID assigned when the domain starts")
        return line
    _emit(s, as_json, text)


@cli.command()
@click.argument("vm", callback=_vm_name)
@click.option("--unplug", is_flag=True, help="Also remove the domain's vsock device.")
@click.option("--device", type=int, default=None, metavar="N",
              help="Only the VM's vGPU N, which must be its last [default: all of them].")
@_json_option
@_agent_options
@click.pass_context
def detach(ctx, vm, unplug, device, as_json):
    """Remove VM's slice (and its domain metadata); its CUDA connections are closed.

    VM is a libvirt domain's name or UUID, or the name a VM was attached by.

    \b
    Examples:
      hvgpu detach vm1
      hvgpu detach vm1 --unplug
      hvgpu detach vm3 --device 1
    """
    s = _call(ctx, "detach", vm=vm, unplug=unplug or None, device=device)
    _emit(s, as_json, lambda s: f"detached {s['vm']}"
          + (f" device {s['device']}" if device is not None else "")
          + f" (released {format_size(sum(v['mem'] for v in s['vgpus']))})")


@cli.command()
@click.argument("vm", callback=_vm_name)
@click.option("--mem", default=None, metavar="SIZE", callback=_checked(_mem),
              help=f"New memory quota: {SIZE_FORMS}; {_MEM_RANGE}.")
@click.option("--compute", default=None, metavar="SHARE", callback=_checked(_compute),
              help="New compute share. " + _COMPUTE_HELP + ".")
@click.option("--allow-time-shared", is_flag=True, help=_TIME_SHARED_HELP)
@click.option("--region", default=None, metavar="SIZE", callback=_checked(_region),
              help="New region (0: none). Only while the guest cannot use it: "
                   "a libvirt domain must be shut off (ivshmem cannot be resized live).")
@_earlier_name("--shm", "region", _checked(_region))
@click.option("--device", type=int, default=0, show_default=True, metavar="N",
              help="Which of the VM's vGPUs.")
@_json_option
@_agent_options
@click.pass_context
def resize(ctx, vm, mem, compute, allow_time_shared, region, region_earlier, device, as_json):
    """Change a running VM's slice.

    VM is a libvirt domain's name or UUID, or the name a VM was attached by.

    The memory quota changes at once for every connection of the VM; shrinking
    below what its guests use is refused with the figure. With MPS, the
    driver-enforced limits (memory ceiling, compute share) are fixed per
    executor process: new CUDA connections get them at once, connections
    already open keep the old ones until they close ("pending" in the output).

    The region (--region) of a libvirt domain changes in its config
    while it is shut off; a running one is refused: stop the guest first, or
    detach the slice and attach it again.

    \b
    Examples:
      hvgpu resize vm1 --mem 8G
      hvgpu resize vm1 --compute 50%
      virsh shutdown vm4 && hvgpu resize vm4 --region 2G
    """
    region = _renamed(ctx, "region")
    s = _call(ctx, "resize", vm=vm, mem=mem, compute=compute, device=device or None, region=region,
              allow_time_shared=allow_time_shared or None)

    def text(s):
        line = (f"resized {s['vm']}" + (f" device {device}" if device else "")
                + f": {format_size(s['mem'])}, compute "
                + _share(s["compute"], s.get("compute_enforced"))
                + (f", region {format_size(s['region'])}" if s.get("region") else ""))
        if s.get("pending"):
            line += ("\nCUDA connections already open keep their MPS limits until they close; "
                     "new ones get the new limits")
        return line
    _emit(s, as_json, text)


@cli.command(name="list")
@_json_option
@_agent_options
@click.pass_context
def list_(ctx, as_json):
    """List the slices.

    \b
    Example:
      hvgpu list --json
    """
    _emit(_call(ctx, "list"), as_json,
          lambda data: _table(_slice_rows(data)) if data else "no slices")


@cli.command()
@_json_option
@_agent_options
@click.pass_context
def status(ctx, as_json):
    """Per slice: memory used of its quota, compute share, connected guest processes.

    UTIL is the slice's own utilization, as hvgpu-guest smi shows it in the
    VM: its executors' share of the GPU as NVML samples it, N/A where NVML
    has no figure for it (under MPS, whose server runs every slice's work,
    or where the driver samples no process). GPU UTIL is the whole GPU's,
    every slice's work together, N/A where NVML cannot say. A compute share
    that MPS does not enforce is shown as "25% (not enforced)"; without one,
    the slice's kernels time-share the GPU ("time-shared").

    \b
    Example:
      hvgpu status
    """
    def text(data):
        if not data:
            return "no slices"
        return _table(_slice_rows(data, extra=(
            ("USED", lambda s: format_size(s["mem_used"]) if s["mem_used"] else "0"),
            ("CONNECTIONS", lambda s: str(s["connections"])),
            ("UTIL", lambda s: _percent(s.get("utilization"))),
            ("GPU UTIL", lambda s: _percent(s.get("gpu_utilization"))),
            ("EXECUTORS", lambda s: ", ".join(
                f"pid {e['pid']}" + (" (retiring)" if e["retiring"] else "")
                for e in s["executors"]) or "-"))))
    _emit(_call(ctx, "status"), as_json, text)


@cli.command(name="domain-xml")
@click.argument("name", callback=_vm_name)
@click.option("--memory", default="8G", show_default=True, metavar="SIZE",
              help=f"Guest RAM, at least 1M: {SIZE_FORMS}.")
@click.option("--vcpus", default=4, show_default=True, type=int, callback=_vcpus_option,
              help=f"Virtual CPUs, 1 to {MAX_VCPUS} (more need an IOMMU with interrupt "
                   "remapping, which this domain does not have).")
@click.option("--disk", required=True, metavar="PATH", help="The guest's disk image.")
@click.option("--disk-format", default="qcow2", show_default=True,
              type=click.Choice(["qcow2", "raw"]))
@click.option("--cloud-init", default=None, metavar="ISO", help="A cloud-init seed ISO.")
@click.option("--network", default="default", show_default=True, help="libvirt network.")
@click.option("--type", "domain_type", default="kvm", show_default=True,
              type=click.Choice(["kvm", "qemu"]), help="qemu: software emulation (no KVM).")
@click.option("--vhost-user-vsock", "vhost_user_vsock", default=None, metavar="SOCKET",
              help="For a host without the vhost_vsock module: the guest's vsock is QEMU's "
                   "vhost-user-vsock device served by a vhost-user backend listening on "
                   "SOCKET (vhost-device-vsock --socket SOCKET --uds-path UDS), instead of "
                   "libvirt's <vsock>; its RAM becomes shared memory. Serve it with "
                   "hvgpu agent --listen hvsock://UDS:5170=NAME.")
@click.option("--region", default=None, metavar="SIZE",
              help="Also an ivshmem-plain device hvgpu-NAME of SIZE for the region of vGPU "
                   "0, as hvgpu attach --region SIZE adds it (give attach the same SIZE). A "
                   "power of two from 1M to 1T.")
@_earlier_name("--shm", "region")
@click.pass_context
def domain_xml_cmd(ctx, name, memory, vcpus, disk, disk_format, cloud_init, network,
                   domain_type, vhost_user_vsock, region, region_earlier):
    """Print a complete q35 domain for a GPU-sharing guest (with its vsock device).

    \b
    Examples:
      hvgpu domain-xml vm1 --memory 8G --vcpus 4 --disk /var/lib/libvirt/images/vm1.qcow2 \\
          --cloud-init /var/lib/libvirt/images/vm1-seed.iso > vm1.xml && virsh define vm1.xml
      hvgpu domain-xml vm2 --disk /var/lib/libvirt/images/vm2.qcow2 \\
          --vhost-user-vsock /run/hvgpu/vm2-vhost.sock > vm2.xml && virsh define vm2.xml
      hvgpu domain-xml vm4 --disk /var/lib/libvirt/images/vm4.qcow2 --region 1G > vm4.xml
    """
    from hvgpu.host.names import VgpuKey, region_name
    from hvgpu.host.render import domain_xml
    from hvgpu.units import parse_region_size

    _refuse_connect(ctx, "it prints XML and talks to no libvirt; define the domain with "
                         "virsh -c URI define FILE")
    try:
        ram = parse_size(memory)
    except HvgpuError as exc:
        raise click.BadParameter(str(exc), param_hint="--memory") from None
    if ram < 1 << 20:
        raise click.BadParameter(f"{memory!r} is {format_size(ram)}: a guest's RAM is at "
                                 "least 1M (libvirt counts it in KiB; a guest needs far more "
                                 "to boot)", param_hint="--memory")

    if vhost_user_vsock is not None and not vhost_user_vsock.startswith("/"):
        # QEMU resolves a relative path from its own working directory, not this one
        raise click.BadParameter(f"{vhost_user_vsock!r} is not an absolute path",
                                 param_hint="--vhost-user-vsock")
    try:
        region = _renamed(ctx, "region")
        region = parse_region_size(region) if region not in (None, "") else 0
        shmem = (region_name(VgpuKey.of(name)), region >> 20) if region else None
        click.echo(domain_xml(name, ram, vcpus, disk, disk_format=disk_format,
                              cloud_init=cloud_init, network=network, domain_type=domain_type,
                              cpu_mode="host-passthrough" if domain_type == "kvm"
                              else "host-model", vhost_user_vsock=vhost_user_vsock,
                              shmem=shmem), nl=False)
    except HvgpuError as exc:
        _fail(exc)


_UNIT_DIRS = {"state_dir": "/var/lib/hvgpu", "cache_dir": "/var/cache/hvgpu"}  # the unit's own


def _unit_dir(ctx, param, value):
    if value is None:
        return None
    if not value.startswith("/") or any(c.isspace() for c in value):
        raise click.BadParameter(f"{value!r}: an absolute path without spaces (systemd's "
                                 "ReadWritePaths= takes it)")
    return os.path.normpath(value)


# What the agent's unit (templates/systemd/hvgpu-agent.service.j2) hides from the
# service: PrivateTmp=yes gives it a /tmp and /var/tmp of its own, empty; ProtectHome=yes
# makes /home, /root and /run/user unreachable.
_UNIT_HIDES = (("/tmp", "PrivateTmp=yes"), ("/var/tmp", "PrivateTmp=yes"),
               ("/home", "ProtectHome=yes"), ("/root", "ProtectHome=yes"),
               ("/run/user", "ProtectHome=yes"))


def _interpreter(exe: str) -> str:
    """The Python a console script runs with (its #! line), else this one."""
    try:
        with open(exe, "rb") as f:
            first = f.readline(4096)
    except OSError:
        first = b""
    if first.startswith(b"#!"):
        words = first[2:].decode(errors="replace").split()
        if words and words[0].startswith("/") and os.path.basename(words[0]) != "env":
            return words[0]
    return sys.executable


def _unit_program_paths(exe: str) -> list[tuple[str, str]]:
    """What the unit's ExecStart needs to reach: (what it is, path), real paths too."""
    import sysconfig

    import hvgpu

    python = _interpreter(exe)
    found = [("the hvgpu command", exe), ("the hvgpu command", os.path.realpath(exe)),
             ("its Python", python), ("its Python", os.path.realpath(python)),
             ("the hvgpu package", os.path.realpath(os.path.dirname(hvgpu.__file__)))]
    stdlib = sysconfig.get_path("stdlib")
    if stdlib:
        found.append(("Python's standard library", os.path.realpath(stdlib)))
    return found


def _hidden_from_unit(paths: list[tuple[str, str]]) -> str | None:
    """Why the agent's unit could not run from these paths (None: it can)."""
    for what, path in paths:
        for top, directive in _UNIT_HIDES:
            if path == top or path.startswith(top + "/"):
                how = ("gives the service a " + top + " of its own, empty"
                       if directive.startswith("PrivateTmp") else
                       "makes " + top + " unreachable to the service")
                return (f"the unit would not start: {what} is {path}, and the unit's "
                        f"{directive} {how}. Install hvgpu where the service can reach it, "
                        "outside /tmp, /var/tmp, /home, /root and /run/user, from a Python "
                        "outside them too (as root: python3 -m venv /opt/hvgpu && "
                        "/opt/hvgpu/bin/pip install 'hvgpu[host]'), and print the unit with "
                        "that hvgpu (/opt/hvgpu/bin/hvgpu systemd-unit)")
    return None


@cli.command(name="systemd-unit")
@click.option("--guest", is_flag=True, help="The guest's unit instead of the host agent's.")
@click.option("--config", metavar="PATH", default=None,
              help=f"The agent reads this configuration file [default: {DEFAULT_CONFIG}].")
@click.option("--state-dir", default=None, metavar="DIR", callback=_unit_dir,
              help="Where the agent keeps slices [default: /var/lib/hvgpu, the unit's "
                   "StateDirectory]; another is made writable (ReadWritePaths=).")
@click.option("--cache-dir", default=None, metavar="DIR", callback=_unit_dir,
              help="Where the agent caches compiled modules [default: /var/cache/hvgpu, the "
                   "unit's CacheDirectory]; another is made writable (ReadWritePaths=).")
@_connect_option
@click.pass_context
def systemd_unit(ctx, guest, config, state_dir, cache_dir):
    """Print a systemd unit for the host agent (or, with --guest, for a VM).

    The agent's unit is hardened (docs/operations.md says what each line
    does and costs): root with a few capabilities, a
    read-only file system but for /var/lib/hvgpu, /run/hvgpu and
    /var/cache/hvgpu, NVIDIA's device nodes only, Type=notify. Options of
    the agent go into /etc/hvgpu/agent.toml (hvgpu agent --print-config);
    -c given here is written into the unit's command line.

    A unit that could not start is refused: one whose hvgpu, its Python or
    the hvgpu package lies under /tmp or /var/tmp (the unit's PrivateTmp=yes
    gives the service its own) or under /home, /root or /run/user
    (ProtectHome=yes hides them). Install hvgpu in /opt/hvgpu, say, first.

    \b
    Examples:
      hvgpu systemd-unit > /etc/systemd/system/hvgpu-agent.service
      systemctl daemon-reload && systemctl enable --now hvgpu-agent
      hvgpu systemd-unit --guest > hvgpu-guest-check.service   # copy into the VM
    """
    import shutil as _shutil

    from hvgpu.host.render import agent_unit, guest_unit

    if guest:
        click.echo(guest_unit("/usr/local/bin/hvgpu-guest"), nl=False)
        return
    exe = _shutil.which("hvgpu") or os.path.abspath(sys.argv[0])
    hidden = _hidden_from_unit(_unit_program_paths(exe))
    if hidden:
        _fail(HvgpuError(hidden))
    args = ["--connect", ctx.obj["connect"]] if ctx.obj["connect_given"] else []
    agent_args = ["--config", config] if config else []
    read_write = []
    for name, value in (("state_dir", state_dir), ("cache_dir", cache_dir)):
        if value is not None and value != _UNIT_DIRS[name]:
            agent_args += ["--" + name.replace("_", "-"), value]
            read_write.append(value)
    click.echo(agent_unit(exe, args, agent_args, read_write), nl=False)


@cli.command()
@click.option("--size", default=1 << 20, show_default=True, help="SAXPY vector length.")
@click.option("--vm", default=None, metavar="NAME",
              help="Use this domain of --connect (it gets a vsock device if it has none) "
                   "[default: a domain on libvirt's built-in test:///default host].")
@_connect_option
@click.pass_context
def demo(ctx, size, vm):
    """Attach a slice, run a checked CUDA workload through it, detach.

    Starts a private agent, attaches a slice to a VM (writing it into the
    domain's metadata), runs SAXPY and a matrix multiply on the slice through
    the guest API, checks both against numpy, and detaches. Where no libvirt
    daemon or VM is given, libvirt's built-in test:///default host stands in;
    where no GPU is usable, it shows the slice and libvirt steps and says
    plainly that CUDA did not run.

    \b
    Examples:
      hvgpu demo
      hvgpu demo --vm vm1
    """
    from hvgpu.host.demo import run_demo

    if vm is None and ctx.obj["connect"] != TEST_URI:
        _refuse_connect(ctx, f"without --vm the demo defines its own domain on libvirt's "
                             f"built-in {TEST_URI} host; name one of your domains with "
                             "--vm NAME to use that libvirt")
    try:
        sys.exit(run_demo(size, echo=click.echo, vm=vm, connect=ctx.obj["connect"]))
    except HvgpuError as exc:
        _fail(exc)


COMPLETE_VAR = "_HVGPU_COMPLETE"  # click's own: the script calls hvgpu back with it set


@cli.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell):
    """Print the shell completion script for SHELL.

    Completion is click's, from this command's definition: subcommands,
    options and their choices.

    \b
    bash: hvgpu completion bash > /etc/bash_completion.d/hvgpu
          (or: eval "$(hvgpu completion bash)" in ~/.bashrc)
    zsh:  hvgpu completion zsh > ~/.zfunc/_hvgpu   (~/.zfunc on $fpath)
    fish: hvgpu completion fish > ~/.config/fish/completions/hvgpu.fish
    """
    from hvgpu.clidoc import completion_script

    click.echo(completion_script(cli, "hvgpu", COMPLETE_VAR, shell))


@cli.command()
def man():
    """Print the man page of hvgpu (roff).

    Generated from this command's definition. Read it with
    `man -l <(hvgpu man)`, or install it as
    /usr/local/share/man/man1/hvgpu.1.
    """
    from hvgpu.clidoc import from_click, man_page

    click.echo(man_page(from_click(cli, "hvgpu"), __version__,
                        see_also=["hvgpu-guest", "virsh"]), nl=False)


# The host extra's modules: a plain `pip install hvgpu` (the guest's install) has click,
# so `hvgpu --help` runs, but a command that reaches for one of these says what to install
HOST_EXTRA_MODULES = {"grpc", "jinja2", "libvirt", "pynvml", "prometheus_client", "cupy",
                      "cuda"}


def main():
    try:
        cli(prog_name="hvgpu", complete_var=COMPLETE_VAR)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in HOST_EXTRA_MODULES:
            raise
        sys.stderr.write(f"hvgpu: the host commands need the host install ({exc.name} is "
                         "missing): pip install 'hvgpu[host]'; in a VM, use hvgpu-guest\n")
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
