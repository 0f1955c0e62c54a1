"""Unmodified CuPy: matmul (cuBLAS), an elementwise kernel (NVRTC), a reduction, random numbers.

Prints results a native run and a run through the shim must print identically;
then, on stderr, which libcuda files are mapped into this process.
"""
import cupy as cp

a = (cp.arange(512 * 512, dtype=cp.float32).reshape(512, 512) % 7) - 3
m = a @ a.T
axpy2 = cp.ElementwiseKernel("float32 x, float32 y", "float32 z", "z = 2 * x + y", "axpy2")
e = axpy2(a, m)
cp.random.seed(1234)
u = cp.random.rand(100000, dtype=cp.float32)
n = cp.random.standard_normal(1000, dtype=cp.float64)
print(f"matmul: sum={float(m.sum()):.1f} trace={float(cp.trace(m)):.1f}")
print(f"elementwise: sum={float(e.sum()):.1f} max={float(e.max()):.1f}")
print(f"reduction: sum_sq={float((a * a).sum()):.1f} argmax={int(a.argmax())} "
      f"mean={float(a.mean()):.6f}")
print(f"random: uniform_sum={float(u.sum()):.3f} normal_mean={float(n.mean()):.6f}")
maps = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libcuda.so" in line})
import sys
print("libcuda mapped: " + " ".join(maps), file=sys.stderr)
