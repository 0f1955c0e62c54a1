"""A worker for tests/bench/test_worker.py: speaks bench/worker.py's protocol with no GPU.

    python -m tests.bench.fake_worker [ok | die-early | hang | noisy-stdout]

Its window "count" adds up 1000-operation batches for the window's seconds; "boom"
raises, to show that a failed command is answered and the worker goes on.
"""

from __future__ import annotations

import sys
import time

from bench import pairs, worker


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
    if mode == "die-early":
        print("cannot start: no GPU", file=sys.stderr, flush=True)
        sys.exit(3)
    if mode == "noisy-stdout":
        print("a library's banner on stdout", flush=True)

    def window(row, seed, seconds):
        if row == "boom":
            raise RuntimeError("the kernel faulted")
        if mode == "hang":
            time.sleep(60)
        ops, elapsed = pairs.window(lambda: 1000, float(seconds))
        return {"ops": ops, "seconds": elapsed, "check": None, "seed": int(seed)}

    worker.serve({"window": window}, {"pid_note": "fake"})


if __name__ == "__main__":
    main()
