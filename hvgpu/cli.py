"""The ``hvgpu`` command line (host side).

A thin adapter: it parses and prints, and leaves the work to the agent and
the guest API. Expected errors (``HvgpuError.expected``) are printed as one
line and exit 1; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import logging
import signal
import sys

import click

from hvgpu import __version__
from hvgpu.errors import HvgpuError
from hvgpu.virtio.protocol import DEFAULT_PORT


def _fail(exc: HvgpuError):
    click.echo(f"hvgpu: error: {exc}", err=True)
    sys.exit(1)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hvgpu")
def cli():
    """GPU sharing for libvirt/KVM hosts.

    The host agent owns the NVIDIA GPUs; a VM's CUDA calls reach it over
    virtio-vsock and run in an executor process of their own on the real GPU.

    \b
    Start here:
      hvgpu demo                      run a checked CUDA workload through the agent
      hvgpu agent                     serve guests on vsock port 5170
    """


@cli.command()
@click.option("--listen", "listen", multiple=True, metavar="ADDR",
              help="Also listen on ADDR (repeatable): unix:///path, "
                   "hvsock:///path/vm.vsock:PORT, tcp://HOST:PORT.")
@click.option("--vsock-port", type=int, default=DEFAULT_PORT, show_default=True,
              help="vsock port guests connect to (host CID 2).")
@click.option("--no-vsock", is_flag=True, help="Do not listen on vsock.")
@click.option("--gpu", type=int, default=0, show_default=True,
              help="CUDA ordinal of the GPU that executors use.")
@click.option("--cache-dir", default=None, metavar="DIR",
              help="Where compiled CUDA C++ modules are cached "
                   "[default: /var/cache/hvgpu as root, else ~/.cache/hvgpu].")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def agent(listen, vsock_port, no_vsock, gpu, cache_dir, log_level):
    """Run the host agent in the foreground until SIGINT/SIGTERM.

    Every accepted guest connection gets an executor process with its own
    CUDA context; the peer is identified by the transport (vsock CID, unix
    credentials, hybrid-vsock socket), never by what the guest claims.

    \b
    Examples:
      hvgpu agent
      hvgpu agent --no-vsock --listen unix:///run/hvgpu/data.sock
      hvgpu agent --listen hvsock:///run/firecracker/vm1.vsock:5170
    """
    from hvgpu.host.agent import Agent, AgentConfig, default_cache_dir

    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s agent %(levelname)s %(message)s")
    config = AgentConfig(listen=list(listen), vsock_port=None if no_vsock else vsock_port,
                         gpu=gpu, cache_dir=cache_dir or default_cache_dir(),
                         log_level=log_level.upper())
    runner = Agent(config)
    try:
        runner.start()
    except HvgpuError as exc:
        _fail(exc)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: runner.stop())
    runner.serve_forever()


@cli.command()
@click.option("--size", default=1 << 20, show_default=True, help="SAXPY vector length.")
def demo(size):
    """Run a checked CUDA workload through a private agent.

    Starts an agent on a temporary unix socket, connects to it with the guest
    API exactly as a VM would over vsock, and runs SAXPY and a matrix multiply
    on the host's GPU, checking both against numpy. On a host without an
    NVIDIA GPU it shows the handshake and says plainly what could not run.
    """
    from hvgpu.demo import run_demo

    try:
        sys.exit(run_demo(size, echo=click.echo))
    except HvgpuError as exc:
        _fail(exc)


def main():
    cli(prog_name="hvgpu")


if __name__ == "__main__":
    main()
