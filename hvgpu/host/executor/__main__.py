"""Entry point of an executor process: ``python -m hvgpu.host.executor``.

Started by the agent with the guest's connected socket inherited as ``--fd``;
serves that one connection, then exits, so every CUDA resource the guest held
goes with the process. Not meant to be run by hand.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from hvgpu.errors import CudaError
from hvgpu.host.executor.compile_cache import CompileCache
from hvgpu.host.executor.session import Session
from hvgpu.virtio import protocol as P
from hvgpu.virtio.transport import adopt

DEFAULT_DEVICE = "hvgpu.host.executor.cuda_device:CudaDevice"


def load_factory(spec: str):
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="hvgpu-executor")
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--peer", required=True)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--device", default=DEFAULT_DEVICE)
    ap.add_argument("--log-level", default="INFO")
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format=f"%(asctime)s executor[{args.peer}] %(levelname)s %(message)s")
    sock = adopt(args.fd)
    device, error = None, None
    try:
        device = load_factory(args.device)(args.gpu)
    except CudaError as exc:
        error = exc
        logging.getLogger(__name__).error("no GPU for %s: %s", args.peer, exc)
    except Exception as exc:  # keep answering the guest, with the reason
        error = CudaError(P.HV_INTERNAL, f"executor could not open GPU {args.gpu}: {exc!r}")
        logging.getLogger(__name__).exception("device setup failed")
    Session(sock, device, peer=args.peer, cache=CompileCache(args.cache_dir),
            device_error=error).serve()
    sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
