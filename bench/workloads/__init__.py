"""Training workloads that bench/frameworks.py runs natively and through the shim.

Each module is a standalone program: ``python3 -m bench.workloads.resnet --steps 30``
prints one JSON line (throughput, the loss trace, round trips per step when it runs
through the shim). Nothing in them knows about hvgpu beyond reading the shim's counter.
"""
