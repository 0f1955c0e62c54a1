/* libhvgpu-client.so.1: the guest's client of the data lane for the Python API
 * (hvgpu/guest/client.py loads it with ctypes from hvgpu/guest/shim/, where it is
 * built beside the shim).
 *
 * It is built from the shim's own wire.c, region_lane.c, region.c and pcopy.c (framing,
 * HELLO, coalescing, the region lane, staging, parallel copies: one
 * implementation), plus this file, which says who it is. It is a library of its own,
 * not libcuda.so.1 loaded into Python: a process that loads a library whose soname is
 * libcuda.so.1 gets it again for every later dlopen("libcuda.so.1") (CuPy, PyTorch,
 * cuda-python in the same process would find the shim instead of NVIDIA's driver),
 * and the shim's crash handler (crash.c, a constructor) has no business in Python.
 *
 * Only wire.c's hvgpu_client_* and region_lane.c's hvgpu_client_* are its API; the
 * per-vGPU connections wire.c also keeps are the shim's, unused here.
 */
#include "shim.h"

const char hv_client_software[] = "hvgpu client library";
const uint64_t hv_client_caps = HVGPU_CAP_PROGRESS;

/* wire.c routes to the current context's vGPU: there are no contexts here. */
struct hv_ctx *hv_current(void) { return NULL; }
