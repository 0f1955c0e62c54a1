"""Native against hvgpu in alternating timed windows, and what the ratios of those pairs say.

Every figure of bench/data_lane.py and bench/frameworks.py is measured the same way:

- a *window* repeats one operation until at least ``seconds`` have passed (2 s unless
  the run is quick), the closing synchronisation inside the timing, and yields the
  operations done and the time they took;
- native and hvgpu windows alternate in pairs, ABBA: native then hvgpu, hvgpu then
  native, native then hvgpu, ... so that a drift of the machine (clocks, a neighbour,
  caches warming) falls on both sides instead of on whichever ran second;
- each pair gives one ratio (hvgpu over native, turned so that above 1 is hvgpu
  better); a row reports the median of those ratios and their spread, the largest
  distance of any pair's ratio from that median, in percent of it. A row whose spread
  is wider than ±NOISY_PCT publishes no ratio: it says it was noisy, and by how much.

Pure logic: no CUDA, no hvgpu, no processes, nothing read from the clock except by
window(), whose clock is a parameter. tests/bench checks all of it without a GPU.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Iterator

SIDES = ("native", "hvgpu")
PAIRS = 3
WINDOW_S = 2.0
QUICK_WINDOW_S = 0.25  # smoke runs only: such results say so and are not published
NOISY_PCT = 10.0


def order(pairs: int) -> Iterator[tuple[int, str]]:
    """(pair, side) in the order to run them: native first in even pairs, hvgpu first in
    odd ones (ABBA), so that neither side is always the one that runs second."""
    for i in range(pairs):
        first, second = SIDES if i % 2 == 0 else SIDES[::-1]
        yield i, first
        yield i, second


def window(op: Callable[[], int | None], seconds: float, finish: Callable[[], None] | None = None,
           clock: Callable[[], float] = time.perf_counter) -> tuple[int, float]:
    """Run ``op`` until at least ``seconds`` have passed, then ``finish`` (a synchronize:
    asynchronous work counts only once it is done); (operations, elapsed seconds).

    ``op`` returns how many operations it did (a batch of launches), or None for one.
    """
    ops = 0
    t0 = clock()
    while True:
        done = op()
        ops += 1 if done is None else done
        if clock() - t0 >= seconds:
            break
    if finish is not None:
        finish()
    return ops, clock() - t0


def run_pairs(measure: Callable[[str, int], dict], pairs: int) -> dict:
    """Every window of a row, in ABBA order: ``measure(side, pair)`` runs one window and
    returns its record (at least "ops" and "seconds"). An exception from it ends the row
    there; the caller records it as the row's failure."""
    out: dict = {side: [] for side in SIDES}
    out["order"] = []
    for pair, side in order(pairs):
        out[side].append(measure(side, pair))
        out["order"].append(side)
    return out


@dataclass(frozen=True)
class Row:
    """One figure: how a window's operations and seconds become its value.

    ``scale`` is the unit's amount per operation (bytes/1e9 for GB/s, flops/1e12 for
    TFLOP/s, 1 for launch/s); for a figure where lower is better (a round trip in µs)
    the value is seconds per operation times ``scale``.
    """

    name: str
    label: str
    unit: str
    scale: float = 1.0
    higher_is_better: bool = True
    target: float | None = None  # the hvgpu/native ratio to reach
    fmt: str = ".2f"

    def value(self, w: dict) -> float:
        if self.higher_is_better:
            return self.scale * w["ops"] / w["seconds"]
        return self.scale * w["seconds"] / w["ops"]


def summary(native: list[float], hvgpu: list[float], higher_is_better: bool = True) -> dict:
    """Per-pair ratios (above 1: hvgpu better), their median, min, max and spread."""
    if not native or len(native) != len(hvgpu):
        raise ValueError(f"{len(native)} native and {len(hvgpu)} hvgpu windows are not pairs")
    ratios = [h / n if higher_is_better else n / h for n, h in zip(native, hvgpu)]
    mid = statistics.median(ratios)
    lo, hi = min(ratios), max(ratios)
    spread = 100.0 * max(hi / mid - 1.0, 1.0 - lo / mid)
    return {"ratios": ratios, "ratio": mid, "min": lo, "max": hi, "spread_pct": spread,
            "noisy": spread > NOISY_PCT, "native": statistics.median(native),
            "hvgpu": statistics.median(hvgpu)}


def entry(row: Row, windows: dict | None, failures: list[str], skipped: str | None = None) -> dict:
    """A measured row as it goes into the results' JSON: every window, the summary of its
    pairs when they are complete, and what failed (a check, an error), if anything.
    ``skipped`` says why a row was not measured at all (no like-for-like native side)."""
    e: dict = {"label": row.label, "unit": row.unit, "higher_is_better": row.higher_is_better,
               "target": row.target, "failures": list(failures)}
    if skipped:
        e["skipped"] = skipped
    if windows is not None:
        e["order"] = windows["order"]
        e["windows"] = {side: windows[side] for side in SIDES}
        for side in SIDES:
            for i, w in enumerate(windows[side]):
                if w.get("check"):
                    e["failures"].append(f"{side}, pair {i + 1}: {w['check']}")
        n, h = windows["native"], windows["hvgpu"]
        if n and len(n) == len(h):
            e.update(summary([row.value(w) for w in n], [row.value(w) for w in h],
                             row.higher_is_better))
    e["status"] = status(e)
    return e


def status(e: dict) -> str:
    if e.get("skipped") and not e.get("failures"):
        return "skipped"
    if e.get("failures") or "ratio" not in e:
        return "failed"
    return "noisy" if e["noisy"] else "ok"


def ratio_cell(e: dict) -> str:
    """The ratio column: median and range, or why there is none."""
    if e["status"] == "skipped":
        return f"not measured: {e['skipped']}"
    if e["status"] == "failed":
        why = (e.get("failures") or ["no complete pair of windows"])[0].splitlines()[0]
        return f"**failed**: {why if len(why) <= 120 else why[:117] + '...'}"
    if e["status"] == "noisy":
        return f"noisy: ±{e['spread_pct']:.0f}% ({e['min']:.2f}–{e['max']:.2f})"
    return f"**{e['ratio']:.2f}** ({e['min']:.2f}–{e['max']:.2f})"


def value_cell(e: dict, side: str, fmt: str) -> str:
    """A side's median over its windows, or nothing where it has none."""
    if side not in e or not isinstance(e[side], (int, float)):
        return ""
    return f"{e[side]:{fmt}} {e['unit']}"


def method(pairs: int, seconds: float, quick: bool) -> dict:
    """How a run measured, as its results' JSON records it (footer() reads it back)."""
    return {"pairs": pairs, "window_s": seconds, "order": "ABBA", "noisy_pct": NOISY_PCT,
            "quick": quick}


def footer(doc: dict) -> str:
    """The sentence under a table: when, how many pairs, how long a window, what noisy means."""
    m = doc["method"]
    text = (f"{doc['when']}: {m['pairs']} pairs of windows of at least {m['window_s']:g} s each, "
            f"native and hvgpu alternating ({m['order']}); a ratio is the median of the "
            f"per-pair ratios (above 1: hvgpu better), with their range; a row whose pairs "
            f"spread wider than ±{m['noisy_pct']:.0f}% of that median is marked noisy.")
    if m["quick"]:
        text += " **Quick run: windows too short to publish.**"
    return text


def arguments(ap) -> None:
    """--pairs, --seconds and --quick, the same for every script of bench/."""
    ap.add_argument("--pairs", type=int, default=PAIRS, help="pairs of windows per row")
    ap.add_argument("--seconds", type=float, help=f"window length (default {WINDOW_S:g} s, "
                    f"{QUICK_WINDOW_S:g} s with --quick)")
    ap.add_argument("--quick", action="store_true",
                    help="short windows for a smoke run: results marked quick, not publishable")


def window_seconds(args) -> float:
    """The window length the arguments ask for; shorter than WINDOW_S, or fewer than PAIRS
    pairs, only with --quick, whose results say they are not publishable."""
    if args.pairs < PAIRS and not args.quick:
        raise SystemExit(f"fewer than {PAIRS} pairs need --quick (such results are not "
                         "publishable)")
    if args.seconds is not None:
        if args.seconds < WINDOW_S and not args.quick:
            raise SystemExit(f"windows shorter than {WINDOW_S:g} s need --quick "
                             "(such results are not publishable)")
        return args.seconds
    return QUICK_WINDOW_S if args.quick else WINDOW_S


def unpublishable(doc: dict) -> str | None:
    """Why a results file must not be published (docs/performance.md), or None."""
    if "method" not in doc:
        return "it comes from before paired windows (no 'method' in it)"
    m = doc["method"]
    if m["quick"]:
        return "it is a quick run (--quick): its windows are too short to believe"
    if m["pairs"] < PAIRS or m["window_s"] < WINDOW_S:
        return f"{m['pairs']} pairs of {m['window_s']:g} s windows are too few to believe"
    return None
