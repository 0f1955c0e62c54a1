"""Programs nobody here wrote, natively and through hvgpu's libcuda shim, side by side.

Two suites, each run from a checkout this script is pointed at (neither suite's code is
kept in this repository; the commit that ran is recorded):

- ``samples``: NVIDIA's cuda-samples (github NVIDIA/cuda-samples). Every sample whose
  CMakeLists.txt needs nothing but the CUDA toolkit is built with nvcc for this GPU (no
  cmake), run natively, and if it passes natively (exit 0), run again with hvgpu's
  libcuda.so.1 first on the library path against an agent started here. A sample passes
  through hvgpu when it exits 0 there too (the samples check their own results).
- ``cupy``: CuPy's own tests (github cupy/cupy, ``tests/``, the tag of the CuPy that is
  installed), package by package, under pytest natively and through the shim at the
  same time; the outcome of each test id both sides reached is compared, and a test
  whose outcomes differ is run again alone on both sides (two suites sharing one GPU
  can disturb each other's memory tests).

On the GPU machine, from the repository root:

    python3 bench/compat.py samples --checkout /path/to/cuda-samples --out /tmp/compat
    python3 bench/compat.py samples --checkout ... --only vectorAdd,simpleCUFFT
    python3 bench/compat.py samples --checkout ... --build-only   # a program newer than its
                                                                  # sources is not rebuilt
    python3 bench/compat.py cupy --checkout /path/to/cupy --packages fft,random --out /tmp/compat
    python3 bench/compat.py cupy --checkout ... --packages core/test_ndarray.py --timeout 300
    python3 bench/compat.py needed-by bench/results/compat-*.json   # for hvgpu-guest coverage

Each writes ``compat-<suite>.json`` (and every run's log under ``logs/``) to --out. A
program that fails through hvgpu is listed with the last lines it printed and the CUDA
entry points the shim said it does not implement.

Must not decide what counts as "cannot work in a VM": that list lives in
docs/compatibility.md with a reason for each entry; this script only measures.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import frameworks, toolkit  # noqa: E402

# What a sample's CMakeLists.txt may link that nvcc finds as -l<name> (the toolkit's own).
CUDA_LIBS = {"cudart": None, "cuda_driver": "cuda", "cublas": "cublas", "cublasLt": "cublasLt",
             "cufft": "cufft", "cufft_static": "cufft", "curand": "curand",
             "cusolver": "cusolver", "cusparse": "cusparse", "nvrtc": "nvrtc",
             "nvjpeg": "nvjpeg", "nvJitLink": "nvJitLink"}
# A sample needing any of these is not built here: a display, another API's interop, MPI.
NOT_BUILT = {r"find_package\(MPI|MPI::|\$\{MPI_": "MPI", r"OPENGL|OpenGL": "OpenGL",
             r"GLUT": "GLUT", r"\bglfw|GLFW": "GLFW", r"Vulkan": "Vulkan",
             r"\bEGL\b|EGL_": "EGL", r"NVSCI": "NvSci", r"FreeImage": "FreeImage",
             r"LLVM": "LLVM", r"NVVM|nvvm": "libNVVM", r"CUDA::npp": "NPP", r"\bX11\b": "X11"}
UNIMPLEMENTED = re.compile(r"hvgpu: (\S+) is not implemented by the hvgpu shim")
NATIVE_TIMEOUT = 120.0
BUILD_TIMEOUT = 600.0


def commit_of(checkout: Path) -> str:
    """The commit a checkout is at: git's, else a COMMIT file beside it."""
    try:
        out = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"],
                             capture_output=True, text=True, timeout=30)
        if out.returncode == 0:
            return out.stdout.strip()
    except OSError:
        pass
    for f in (checkout / "COMMIT", checkout.parent / "COMMIT"):
        if f.exists():
            return f.read_text().strip()
    return "unknown"


def gpu_arch() -> str:
    out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=30).stdout.split()
    return "sm_" + out[0].replace(".", "") if out else "sm_90"


def library_dirs() -> list[str]:
    """-I/-L for the toolkit and for NVIDIA's library wheels (cuFFT, cuRAND, ... may be
    there alone)."""
    import glob
    import sysconfig
    roots = [os.environ.get("CUDA_HOME", "/usr/local/cuda")]
    purelib = sysconfig.get_paths()["purelib"]
    roots += glob.glob(os.path.join(purelib, "nvidia", "*")) + \
        glob.glob(os.path.join(purelib, "nvidia", "*", "*"))
    flags = []
    for root in roots:
        for sub, flag in (("include", "-I"), ("lib64", "-L"), ("lib", "-L")):
            d = os.path.join(root, sub)
            if os.path.isdir(d):
                flags.append(flag + d)
                if flag == "-L":
                    flags.append("-Xlinker=-rpath=" + d)
        stubs = os.path.join(root, "lib64", "stubs")
        if os.path.isdir(stubs):  # -lcuda at link time; the loader finds the real one (or hvgpu's)
            flags.append("-L" + stubs)
    return flags


# -- cuda-samples ---------------------------------------------------------------------

class Sample:
    def __init__(self, directory: Path, root: Path):
        self.dir = directory
        self.name = directory.name
        self.category = directory.parent.name
        self.cmake = (directory / "CMakeLists.txt").read_text(errors="replace")
        self.root = root

    def why_not_built(self) -> str | None:
        for pattern, what in NOT_BUILT.items():
            if re.search(pattern, self.cmake):
                return f"needs {what}"
        if "add_executable" not in self.cmake:
            return "no executable"
        return None

    def sources(self) -> list[str]:
        m = re.search(r"add_executable\(\s*\S+\s+([^)]*)\)", self.cmake)
        if not m:
            return []
        return [s for s in m.group(1).split() if re.match(r"^[\w./-]+\.(cu|cpp|c|cc)$", s)]

    def libraries(self) -> list[str]:
        libs = []
        for name in re.findall(r"CUDA::(\w+)", self.cmake):
            lib = CUDA_LIBS.get(name, name)
            # CMake's CUDA::cusolver brings the libraries cuSOLVER needs with it
            for dep in [lib] + (["cusparse", "cublasLt"] if lib == "cusolver" else []):
                if dep and f"-l{dep}" not in libs:
                    libs.append(f"-l{dep}")
        if "NVJITLINK_LIB" in self.cmake and "-lnvJitLink" not in libs:  # find_library()'d
            libs.append("-lnvJitLink")
        if "OpenMP" in self.cmake:
            libs.append("-Xcompiler=-fopenmp")
        return libs

    def include_dirs(self) -> list[str]:
        """The sample's own directories its target_include_directories name (inc, ...)."""
        dirs = []
        for block in re.findall(r"target_include_directories\([^)]*\)", self.cmake):
            dirs += [d for d in block.split()[2:] if re.match(r"^[\w./-]+$", d.rstrip(")"))
                     and (self.dir / d.rstrip(")")).is_dir()]
        return [d.rstrip(")") for d in dirs]

    def kernels(self) -> list[tuple[str, str]]:
        """(output, kernel source) of the fatbins/PTX its CMake builds beside it."""
        outputs = re.findall(r'set\(\w+\s+"\$\{CMAKE_CURRENT_BINARY_DIR\}/([\w.]+\.(?:fatbin|ptx|cubin))"\)',
                             self.cmake)
        sources = re.findall(r'set\(\w+\s+"\$\{CMAKE_CURRENT_SOURCE_DIR\}/([\w.]+\.cu)"\)', self.cmake)
        return list(zip(outputs, sources))

    def build(self, arch: str, extra: list[str]) -> str | None:
        """Builds into the sample's own directory; None, or why it did not build."""
        sources = self.sources()
        if not sources:
            return "no sources found in add_executable"
        exe = self.dir / self.name
        if exe.exists() and all(exe.stat().st_mtime >= (self.dir / f).stat().st_mtime
                                for f in sources if (self.dir / f).exists()):
            return None  # built by an earlier run
        common = ["-O2", "-std=c++17", "--extended-lambda", "-Wno-deprecated-gpu-targets",
                  f"-arch={arch}", f"-I{self.root / 'Common'}", f"-I{self.dir}",
                  *(f"-I{self.dir / d}" for d in self.include_dirs())] + extra
        if "CUDA_SEPARABLE_COMPILATION ON" in self.cmake:
            common.append("-rdc=true")
        log = []
        for out, src in self.kernels():
            kind = out.rsplit(".", 1)[1]
            cmd = [toolkit.nvcc(), f"-arch={arch}", f"-I{self.root / 'Common'}", f"-{kind}",
                   "-o", out, src]
            p = subprocess.run(cmd, cwd=self.dir, capture_output=True, text=True,
                               timeout=BUILD_TIMEOUT)
            if p.returncode:
                return "kernel build failed: " + (p.stderr or p.stdout)[-600:]
        cmd = [toolkit.nvcc(), *common, "-o", self.name, *sources, *self.libraries()]
        p = subprocess.run(cmd, cwd=self.dir, capture_output=True, text=True,
                           timeout=BUILD_TIMEOUT)
        log.append(p.stderr)
        if p.returncode:
            return "build failed: " + (p.stderr or p.stdout)[-600:]
        return None


def run_program(argv: list[str], cwd: Path, env: dict, timeout: float, log: Path) -> dict:
    t0 = time.perf_counter()
    try:
        p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = "timeout", exc.stdout or b"", exc.stderr or b""
    secs = time.perf_counter() - t0
    out, err = out.decode(errors="replace"), err.decode(errors="replace")
    log.write_text(f"$ {' '.join(argv)}\nexit: {rc}\n---- stdout ----\n{out}\n"
                   f"---- stderr ----\n{err}")
    result = {"rc": rc, "seconds": round(secs, 3)}
    if rc != 0:
        result["tail"] = (out[-1200:] + "\n" + err[-1500:]).strip()
    missing = sorted(set(UNIMPLEMENTED.findall(err)))
    if missing:
        result["not_implemented"] = missing
    return result


def verdict(native: dict, hv: dict | None) -> str:
    if native["rc"] == 2:
        return "waived natively"
    if native["rc"] != 0:
        return "fails natively"
    return "passes" if hv and hv["rc"] == 0 else "fails through hvgpu"


def run_samples(args) -> dict:
    checkout = Path(args.checkout).resolve()
    arch = args.arch or gpu_arch()
    only = set(args.only.split(",")) if args.only else None
    samples = [Sample(d.parent, checkout) for d in sorted(checkout.glob("Samples/*/*/CMakeLists.txt"))]
    samples = [s for s in samples if not only or s.name in only]
    logs = Path(args.out) / "logs" / "samples"
    logs.mkdir(parents=True, exist_ok=True)
    extra = library_dirs()
    rows: dict[str, dict] = {}
    buildable = []
    for s in samples:
        why = s.why_not_built()
        rows[s.name] = {"category": s.category}
        if why:
            rows[s.name]["verdict"] = f"not built: {why}"
        else:
            buildable.append(s)
    print(f"building {len(buildable)} of {len(samples)} samples for {arch} "
          f"({args.jobs} at a time)", flush=True)
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for s, why in zip(buildable, pool.map(lambda s: s.build(arch, extra), buildable)):
            if why:
                rows[s.name]["verdict"] = "not built"
                rows[s.name]["build"] = why
    if args.build_only:
        return {"suite": "cuda-samples", "commit": commit_of(checkout), "arch": arch,
                "samples": rows}
    agent, address = frameworks.start_agent()
    shim = frameworks.shim_env(address, trace=False)
    shim.pop("HVGPU_SHIM_STATS", None)
    lock = threading.Lock()

    def one(s: Sample) -> None:
        row = rows[s.name]
        if "verdict" in row:
            return
        exe = [str(s.dir / s.name)]
        row["native"] = run_program(exe, s.dir, dict(os.environ), NATIVE_TIMEOUT,
                                    logs / f"{s.name}.native.log")
        hv = None
        if row["native"]["rc"] == 0:
            timeout = max(60.0, 10 * row["native"]["seconds"])
            hv = row["hvgpu"] = run_program(exe, s.dir, shim, timeout,
                                            logs / f"{s.name}.hvgpu.log")
        row["verdict"] = verdict(row["native"], hv)
        with lock:
            save(args, {"suite": "cuda-samples", "commit": commit_of(checkout), "partial": True,
                        "samples": rows})
            print(f"{s.category}/{s.name}: {row['verdict']}"
                  + (f" (native {row['native']['seconds']:.2f} s, hvgpu {hv['seconds']:.2f} s)"
                     if hv else ""), flush=True)

    try:  # several samples at once: their results, not their timings, are compared
        with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
            list(pool.map(one, buildable))
    finally:
        agent.stop()
    counts: dict[str, int] = {}
    for row in rows.values():
        key = row["verdict"].split(":")[0]
        counts[key] = counts.get(key, 0) + 1
    return {"suite": "cuda-samples", "commit": commit_of(checkout), "arch": arch,
            "machine": frameworks.machine(), "counts": counts, "samples": rows}


def save(args, doc: dict) -> Path:
    """Written after every program, so a run cut short still leaves what it measured."""
    path = Path(args.out) / f"compat-{args.suite}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    return path


# -- CuPy's tests ---------------------------------------------------------------------

DEFAULT_PACKAGES = ["fft", "linalg", "random", "sparse", "cuda", "core", "creation"]


def junit_outcomes(path: Path) -> dict[str, str]:
    outcomes = {}
    if not path.exists():
        return outcomes
    for case in ET.parse(path).iter("testcase"):
        tid = f"{case.get('classname')}::{case.get('name')}"
        kind = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                kind = "failed"
            elif child.tag == "skipped":
                kind = "skipped" if kind == "passed" else kind
        outcomes[tid] = kind
    return outcomes


def cupy_package_dir(tests: Path, package: str) -> Path:
    for base in ("cupy_tests", "cupyx_tests"):
        d = tests / base / f"{package}_tests"
        if d.is_dir():
            return d
    d = tests / "cupyx_tests" / "scipy_tests" / f"{package}_tests"
    if d.is_dir():
        return d
    raise SystemExit(f"no package {package!r} under {tests}/cupy_tests or cupyx_tests")


VERBOSE_LINE = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", re.M)


def verbose_outcomes(log: Path) -> dict[str, str]:
    """Outcomes as pytest -v printed them: what a run cut short still says (its junit
    file is written only at the end). Ids are turned into junit's classname::name."""
    outcomes = {}
    text = log.read_text(errors="replace") if log.exists() else ""
    for tid, kind in VERBOSE_LINE.findall(text):
        path, _, name = tid.partition("::")
        cls, _, test = name.rpartition("::")
        mod = path[:-3].replace("/", ".") if path.endswith(".py") else path
        key = f"{mod}.{cls}::{test}" if cls else f"{mod}::{test}"
        outcomes[key] = {"PASSED": "passed", "XPASS": "passed", "SKIPPED": "skipped",
                         "XFAIL": "skipped"}.get(kind, "failed")
    return outcomes


def run_pytest(targets: list[str], cwd: Path, env: dict, xml: Path, timeout: float, log: Path,
               extra: list[str]) -> dict:
    """pytest on targets; past timeout it is interrupted (SIGINT), so it still reports
    what it ran, and killed 60 s later."""
    argv = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider",
            f"--junitxml={xml}", *extra, *targets]
    t0 = time.perf_counter()
    with open(log, "wb") as f:
        p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)
        cut = False
        try:
            rc = p.wait(timeout)
        except subprocess.TimeoutExpired:
            cut = True
            p.send_signal(signal.SIGINT)
            try:
                rc = p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                rc = p.wait()
    outcomes = junit_outcomes(xml) or verbose_outcomes(log)
    text = log.read_text(errors="replace")
    result = {"rc": rc, "seconds": round(time.perf_counter() - t0, 1), "cut_short": cut,
              "outcomes": outcomes}
    missing = sorted(set(UNIMPLEMENTED.findall(text)))
    if missing:
        result["not_implemented"] = missing
    return result


def tally(outcomes: dict[str, str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for v in outcomes.values():
        counts[v] = counts.get(v, 0) + 1
    return counts


def cupy_targets(tests: Path, package: str) -> list[str]:
    """A package name (fft, core, ...) or a path under tests/ (a file, a file::test)."""
    if "/" in package:
        return [package]
    return [str(cupy_package_dir(tests, package).relative_to(tests))]


def compare(nat: dict[str, str], hv: dict[str, str]) -> tuple[dict, list[str]]:
    """Tests whose outcome differs among those both sides reached, and those only one
    side reached (a run cut short), which are not counted as differing."""
    both = set(nat) & set(hv)
    differ = {t: {"native": nat[t], "hvgpu": hv[t]} for t in sorted(both) if nat[t] != hv[t]}
    return differ, sorted(set(nat) ^ set(hv))


def junit_id_to_node(tid: str) -> str:
    """classname::name back to a pytest node id (path::Class::test)."""
    cls, _, name = tid.partition("::")
    parts = cls.split(".")
    for i in range(len(parts), 0, -1):  # the longest prefix that is a module path
        if parts[i - 1].startswith("test_"):
            return "/".join(parts[:i]) + ".py::" + "::".join(parts[i:] + [name])
    return tid


def run_cupy(args) -> dict:
    checkout = Path(args.checkout).resolve()
    tests = checkout / "tests" if (checkout / "tests").is_dir() else checkout
    out = Path(args.out)
    logs = out / "logs" / "cupy"
    logs.mkdir(parents=True, exist_ok=True)
    agent, address = frameworks.start_agent()
    shim = frameworks.shim_env(address, trace=False)
    shim.pop("HVGPU_SHIM_STATS", None)
    native_env = dict(os.environ)
    for side, env in (("native", native_env), ("hvgpu", shim)):
        env["CUPY_CACHE_DIR"] = str(out / f"cupy-cache-{side}")
    extra = args.pytest_args.split() if args.pytest_args else []
    sides = (("native", native_env), ("hvgpu", shim))
    packages: dict[str, dict] = {}
    lock = threading.Lock()

    def one(package: str) -> None:
        name = package.replace("/", "_").replace(":", "_")
        with concurrent.futures.ThreadPoolExecutor(2) as pool:  # both sides at once
            runs = dict(zip([s for s, _ in sides], pool.map(
                lambda se: run_pytest(cupy_targets(tests, package), tests, se[1],
                                      logs / f"{name}.{se[0]}.xml", args.timeout,
                                      logs / f"{name}.{se[0]}.log", extra), sides)))
        nat, hv = runs["native"]["outcomes"], runs["hvgpu"]["outcomes"]
        differ, one_side = compare(nat, hv)
        if differ and args.recheck:  # run each differing test again, alone, on both sides
            ids = [junit_id_to_node(t) for t in list(differ)[:args.recheck]]
            again = {}
            for side, env in sides:
                again[side] = run_pytest(ids, tests, env, logs / f"{name}.{side}.recheck.xml",
                                         args.timeout, logs / f"{name}.{side}.recheck.log",
                                         extra)["outcomes"]
            for t in list(differ)[:args.recheck]:
                n2, h2 = again["native"].get(t), again["hvgpu"].get(t)
                if n2 is not None and n2 == h2:
                    differ[t]["recheck"] = f"same when run alone ({n2})"
        real = {t: d for t, d in differ.items() if "recheck" not in d}
        row = {side: {"tally": tally(runs[side]["outcomes"]), "seconds": runs[side]["seconds"],
                      "rc": runs[side]["rc"], "cut_short": runs[side]["cut_short"]}
               for side, _ in sides}
        row["hvgpu"]["not_implemented"] = runs["hvgpu"].get("not_implemented", [])
        row.update({"compared": len(set(nat) & set(hv)), "same": not real,
                    "differ_count": len(real), "differ": dict(list(real.items())[:200]),
                    "flaky_when_concurrent": {t: d for t, d in differ.items() if "recheck" in d},
                    "reached_by_one_side_only": len(one_side)})
        with lock:
            packages[package] = row
            save(args, {"suite": "cupy-tests", "commit": commit_of(checkout), "partial": True,
                        "packages": packages})
        print(f"{package}: native {row['native']['tally']} hvgpu {row['hvgpu']['tally']}; "
              f"{row['compared']} compared, {len(real)} differ"
              + (f", {len(one_side)} reached by one side only" if one_side else ""), flush=True)

    try:
        with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
            list(pool.map(one, args.packages.split(",")))
    finally:
        agent.stop()
    return {"suite": "cupy-tests", "commit": commit_of(checkout), "pytest_args": extra,
            "machine": frameworks.machine(), "packages": packages}


NEEDED_BY = ROOT / "hvgpu" / "guest" / "shim" / "needed_by.json"


def needed_by(results: list[Path]) -> dict:
    """Each entry point the shim said it does not implement, with the programs of the
    suites that called it (what ``hvgpu-guest coverage`` shows beside it)."""
    needed: dict[str, set[str]] = {}
    sources = []
    for path in results:
        doc = json.loads(path.read_text())
        sources.append(f"{doc['suite']} {doc.get('commit', 'unknown')[:12]}")
        for name, row in doc.get("samples", {}).items():
            for api in row.get("hvgpu", {}).get("not_implemented", []):
                needed.setdefault(api, set()).add(f"cuda-samples/{name}")
        for name, row in doc.get("packages", {}).items():
            for api in row.get("hvgpu", {}).get("not_implemented", []):
                needed.setdefault(api, set()).add(f"cupy-tests/{name}")
    return {"from": sources, "needed_by": {api: sorted(p) for api, p in sorted(needed.items())}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="suite", required=True)
    s = sub.add_parser("samples", help="NVIDIA cuda-samples")
    s.add_argument("--checkout", required=True, help="a checkout of NVIDIA/cuda-samples")
    s.add_argument("--only", help="comma-separated sample names")
    s.add_argument("--arch", help="nvcc -arch (default: this GPU's)")
    s.add_argument("--jobs", type=int, default=os.cpu_count() or 4)
    s.add_argument("--build-only", action="store_true", help="build, run nothing")
    s.add_argument("--parallel", type=int, default=4, help="samples run at once (each its "
                   "native run, then its hvgpu run)")
    c = sub.add_parser("cupy", help="CuPy's tests")
    c.add_argument("--checkout", required=True, help="a checkout of cupy/cupy (or its tests/)")
    c.add_argument("--packages", default=",".join(DEFAULT_PACKAGES))
    c.add_argument("--timeout", type=float, default=1800.0,
                   help="seconds per package and side; a package cut short is compared on "
                        "the tests both sides reached")
    c.add_argument("--parallel", type=int, default=1, help="packages run at once (each "
                   "runs its native and hvgpu sides at once)")
    c.add_argument("--recheck", type=int, default=50, help="differing tests run again alone "
                   "on both sides, at most this many per package (0: none)")
    c.add_argument("--pytest-args", default="", help="more pytest arguments (e.g. '-k fft2')")
    for p in (s, c):
        p.add_argument("--out", default="/tmp/hvgpu-compat")
    n = sub.add_parser("needed-by", help=f"write {NEEDED_BY.relative_to(ROOT)} from results: "
                       "which programs called each entry point the shim refused")
    n.add_argument("results", nargs="+", type=Path, help="compat-*.json files")
    args = ap.parse_args()
    if args.suite == "needed-by":
        NEEDED_BY.write_text(json.dumps(needed_by(args.results), indent=1) + "\n")
        print(f"wrote {NEEDED_BY}")
        return 0
    if not toolkit.nvcc() and args.suite == "samples":
        raise SystemExit("nvcc is not found: the samples are built with the CUDA toolkit")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    doc = run_samples(args) if args.suite == "samples" else run_cupy(args)
    print(f"wrote {save(args, doc)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
