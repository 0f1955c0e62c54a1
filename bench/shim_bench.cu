// The shim's half of bench/data_lane.py: one CUDA program, built with nvcc's defaults
// (static cudart) and cuBLAS, run as two processes of the same benchmark run, one on the
// real driver and one through hvgpu's libcuda.so.1. Each is asked for one timed window
// at a time (bench/worker.py's protocol), so that native and shim windows alternate:
//
//   window launch SEED SECONDS              <<<>>> launches of a kernel that counts them
//   window sgemm SEED SECONDS               cuBLAS sgemm, N x N (N: argv[1], else 4096)
//   window h2d:BYTES:pageable SEED SECONDS  cudaMemcpy from malloc'd memory ...
//   window d2h:BYTES:pinned SEED SECONDS    ... or to cudaMallocHost'd memory
//   quit
//
// A window repeats its operation until SECONDS have passed, then synchronizes; it answers
// {"ops", "seconds", "check"}, check being null or what was wrong. Everything timed is
// checked, so that an operation that did nothing cannot pass: the launch counter starts
// where SEED says and must count every launch; sgemm's output is poisoned (all bits set:
// NaN) before the window and sampled against double-precision dot products after it; a
// copy's destination is poisoned (0xFF) and its source patterned afresh from SEED (bytes
// 0..254, never the poison) before the window, and compared with that pattern after it.
// Before it says ready, the program copies odd sizes at odd offsets both ways, pageable
// and pinned, with guard bytes around each destination (as bench/checks.py does).
//
// Must print nothing on stdout but protocol lines; a CUDA error is answered as
// {"error": ...} and ends the process (CUDA's errors are sticky).
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cublas_v2.h>

extern "C" __global__ void tick(unsigned int *n, int k) {
    if (threadIdx.x == 0) atomicAdd(n, (unsigned int)k);
}

static const uint8_t POISON = 0xFF;
static const size_t PERIOD = 65521;  // prime: never lines up with a page or a chunk
static const size_t GUARD = 16;
static const int LAUNCH_BATCH = 1000;
static const int SGEMM_BATCH = 5;
static const size_t CASES[][2] = {{1, 0}, {3, 1}, {4093, 0}, {4099, 7}, {65537, 5},
                                  {(1u << 20) + 7, 0}, {(8u << 20) + 4099, 3},
                                  {(24u << 20) + 1, 0}};
static const size_t CHECK_BYTES = (24u << 20) + 1 + 2 * GUARD + 64;

static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static void json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') putchar('\\');
        if ((unsigned char)*s < 0x20) printf("\\u%04x", (unsigned char)*s);
        else putchar(*s);
    }
    putchar('"');
}

static void reply_error(const char *what, const char *why) {
    char text[512];
    snprintf(text, sizeof text, "%s: %s", what, why);
    printf("{\"error\": ");
    json_string(text);
    printf("}\n");
    fflush(stdout);
}

#define CHECK(x) do { cudaError_t e_ = (x); \
    if (e_ != cudaSuccess) { reply_error(#x, cudaGetErrorString(e_)); exit(1); } } while (0)

static void reply(long long ops, double seconds, const char *problem) {
    printf("{\"ops\": %lld, \"seconds\": %.9g, \"check\": ", ops, seconds);
    if (problem) json_string(problem);
    else printf("null");
    printf("}\n");
    fflush(stdout);
}

// Bytes 0..254 drawn from seed, repeating every PERIOD bytes.
static void fresh(uint8_t *p, size_t n, unsigned seed) {
    uint32_t x = seed * 2654435761u + 0x9E3779B9u;
    if (x == 0) x = 1;
    size_t first = n < PERIOD ? n : PERIOD;
    for (size_t i = 0; i < first; i++) {
        x ^= x << 13; x ^= x >> 17; x ^= x << 5;
        p[i] = (uint8_t)(x % 255u);
    }
    for (size_t done = first; done < n;) {  // doubling: every copy keeps the period
        size_t c = done < n - done ? done : n - done;
        memcpy(p + done, p, c);
        done += c;
    }
}

static char msg[512];

// NULL when equal; else msg says how many bytes differ and the first of them.
static const char *differ(const char *what, const uint8_t *got, const uint8_t *want, size_t n) {
    if (memcmp(got, want, n) == 0) return NULL;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i] && bad++ == 0) first = i;
    snprintf(msg, sizeof msg, "%s: %zu of %zu bytes differ, the first at byte %zu: 0x%02x, "
             "expected 0x%02x%s", what, bad, n, first, got[first], want[first],
             got[first] == POISON ? " (the poison: nothing was copied there)" : "");
    return msg;
}

static const char *poisoned(const char *what, const uint8_t *got, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (got[i] != POISON) {
            snprintf(msg, sizeof msg, "%s: byte %zu is 0x%02x where the poison must be left",
                     what, i, got[i]);
            return msg;
        }
    return NULL;
}

// Buffers grow to the largest size asked for; two of each kind of host memory, so that a
// check can read back into memory of the kind it checks.
static size_t cap = 0;
static uint8_t *host, *back, *pinned, *pinned2, *dev;

static void ensure(size_t n) {
    if (n <= cap) return;
    if (cap) {
        free(host); free(back);
        CHECK(cudaFreeHost(pinned)); CHECK(cudaFreeHost(pinned2)); CHECK(cudaFree(dev));
    }
    host = (uint8_t *)malloc(n);
    back = (uint8_t *)malloc(n);
    if (!host || !back) { reply_error("malloc", "out of memory"); exit(1); }
    CHECK(cudaMallocHost((void **)&pinned, n));
    CHECK(cudaMallocHost((void **)&pinned2, n));
    CHECK(cudaMalloc((void **)&dev, n));
    cap = n;
}

// Fresh bytes into the poisoned device at offset, read back whole and framed by guards.
static const char *roundtrip(uint8_t *src, uint8_t *dst, size_t size, size_t offset,
                             unsigned seed) {
    static char where[128];
    fresh(src, size, seed);
    CHECK(cudaMemset(dev, POISON, offset + size + GUARD));
    CHECK(cudaMemcpy(dev + offset, src, size, cudaMemcpyHostToDevice));
    CHECK(cudaDeviceSynchronize());
    memset(dst, POISON ^ 0x5A, offset + size + GUARD);
    CHECK(cudaMemcpy(dst, dev, offset + size + GUARD, cudaMemcpyDeviceToHost));
    snprintf(where, sizeof where, "H2D of %zu bytes at offset %zu, read back", size, offset);
    const char *p = poisoned(where, dst, offset);
    if (!p) p = differ(where, dst + offset, src, size);
    if (!p) p = poisoned(where, dst + offset + size, GUARD);
    if (p) return p;
    memset(dst, POISON, size + 2 * GUARD);
    CHECK(cudaMemcpy(dst + GUARD, dev + offset, size, cudaMemcpyDeviceToHost));
    snprintf(where, sizeof where, "D2H of %zu bytes from offset %zu", size, offset);
    p = poisoned(where, dst, GUARD);
    if (!p) p = differ(where, dst + GUARD, src, size);
    if (!p) p = poisoned(where, dst + GUARD + size, GUARD);
    return p;
}

static const char *odd_sizes(unsigned seed) {
    static char out[640];
    ensure(CHECK_BYTES);
    for (int kind = 0; kind < 2; kind++)
        for (size_t k = 0; k < sizeof CASES / sizeof CASES[0]; k++) {
            const char *p = kind ? roundtrip(pinned, pinned2, CASES[k][0], CASES[k][1], seed + k)
                                 : roundtrip(host, back, CASES[k][0], CASES[k][1], seed + k);
            if (p) {
                snprintf(out, sizeof out, "%s memory: %s", kind ? "pinned" : "pageable", p);
                return out;
            }
        }
    return NULL;
}

static unsigned int *counter;

static void launch_window(unsigned seed, double seconds) {
    unsigned int start = seed * 7919u + 12345u, got = 0;
    CHECK(cudaMemcpy(counter, &start, sizeof start, cudaMemcpyHostToDevice));
    long long ops = 0;
    double t0 = now();
    do {
        for (int i = 0; i < LAUNCH_BATCH; i++) tick<<<1, 32>>>(counter, 1);
        ops += LAUNCH_BATCH;
    } while (now() - t0 < seconds);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    double elapsed = now() - t0;
    CHECK(cudaMemcpy(&got, counter, sizeof got, cudaMemcpyDeviceToHost));
    unsigned int want = start + (unsigned int)ops;
    const char *problem = NULL;
    if (got != want) {
        snprintf(msg, sizeof msg, "the launch counter reads %u after %lld launches from %u, "
                 "not %u: %u of them ran", got, ops, start, want, got - start);
        problem = msg;
    }
    reply(ops, elapsed, problem);
}

static int N = 4096;
static cublasHandle_t handle;
static float *A, *B, *C, *hA, *hB;

static void sgemm_window(unsigned seed, double seconds) {
    size_t bytes = (size_t)N * N * sizeof(float);
    if (!A) {  // inputs drawn once; the output is what each window must write anew
        hA = (float *)malloc(bytes);
        hB = (float *)malloc(bytes);
        uint32_t x = 12345;
        for (size_t i = 0; i < (size_t)N * N; i++) {
            x ^= x << 13; x ^= x >> 17; x ^= x << 5;
            hA[i] = (float)((x >> 8) * (1.0 / 16777216.0) * 2.0 - 1.0);
            x ^= x << 13; x ^= x >> 17; x ^= x << 5;
            hB[i] = (float)((x >> 8) * (1.0 / 16777216.0) * 2.0 - 1.0);
        }
        CHECK(cudaMalloc((void **)&A, bytes)); CHECK(cudaMalloc((void **)&B, bytes));
        CHECK(cudaMalloc((void **)&C, bytes));
        CHECK(cudaMemcpy(A, hA, bytes, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(B, hB, bytes, cudaMemcpyHostToDevice));
    }
    CHECK(cudaMemset(C, POISON, bytes));
    CHECK(cudaDeviceSynchronize());
    float one = 1, zero = 0;
    long long ops = 0;
    double t0 = now();
    do {
        for (int i = 0; i < SGEMM_BATCH; i++)
            if (cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, N, N, N, &one, A, N, B, N, &zero,
                            C, N) != CUBLAS_STATUS_SUCCESS) {
                reply_error("cublasSgemm", "failed");
                exit(1);
            }
        ops += SGEMM_BATCH;
        // Waited for each batch: the GPU, not how deep a queue is, bounds the window (the
        // shim's one-way launches queue far more than the driver's own queue holds).
        CHECK(cudaDeviceSynchronize());
    } while (now() - t0 < seconds);
    CHECK(cudaDeviceSynchronize());
    double elapsed = now() - t0;
    const char *problem = NULL;
    uint32_t x = seed * 2654435761u + 1;
    for (int s = 0; s < 16 && !problem; s++) {  // column-major: C[i + j*N] = sum_k A[i + k*N] B[k + j*N]
        x ^= x << 13; x ^= x >> 17; x ^= x << 5;
        int i = x % N;
        x ^= x << 13; x ^= x >> 17; x ^= x << 5;
        int j = x % N;
        float c;
        CHECK(cudaMemcpy(&c, C + i + (size_t)j * N, sizeof c, cudaMemcpyDeviceToHost));
        double ref = 0, mag = 0;
        for (int k = 0; k < N; k++) {
            double t = (double)hA[i + (size_t)k * N] * hB[k + (size_t)j * N];
            ref += t;
            mag += fabs(t);
        }
        if (!(fabs(c - ref) <= 1e-3 * mag)) {  // NaN, the poison, fails too
            snprintf(msg, sizeof msg, "C[%d,%d] is %g, the host's dot product %g", i, j, c, ref);
            problem = msg;
        }
    }
    reply(ops, elapsed, problem);
}

static void copy_window(bool h2d, bool use_pinned, size_t size, unsigned seed, double seconds) {
    ensure(size);
    const char *problem = NULL;
    long long ops = 0;
    double t0, elapsed;
    if (h2d) {
        uint8_t *src = use_pinned ? pinned : host;
        fresh(src, size, seed);
        CHECK(cudaMemset(dev, POISON, size));
        CHECK(cudaDeviceSynchronize());
        t0 = now();
        do {
            CHECK(cudaMemcpy(dev, src, size, cudaMemcpyHostToDevice));
            ops++;
        } while (now() - t0 < seconds);
        CHECK(cudaDeviceSynchronize());
        elapsed = now() - t0;
        uint8_t *check = use_pinned ? pinned2 : back;
        memset(check, POISON ^ 0x5A, size);
        CHECK(cudaMemcpy(check, dev, size, cudaMemcpyDeviceToHost));
        problem = differ("device memory after the window, read back", check, src, size);
    } else {
        uint8_t *want = use_pinned ? pinned2 : back, *dst = use_pinned ? pinned : host;
        fresh(want, size, seed);
        CHECK(cudaMemcpy(dev, want, size, cudaMemcpyHostToDevice));
        memset(dst, POISON, size);
        CHECK(cudaDeviceSynchronize());
        t0 = now();
        do {
            CHECK(cudaMemcpy(dst, dev, size, cudaMemcpyDeviceToHost));
            ops++;
        } while (now() - t0 < seconds);
        CHECK(cudaDeviceSynchronize());
        elapsed = now() - t0;
        problem = differ("host memory after the window", dst, want, size);
    }
    reply(ops, elapsed, problem);
}

int main(int argc, char **argv) {
    if (argc > 1) N = atoi(argv[1]);
    CHECK(cudaSetDevice(0));
    CHECK(cudaMalloc((void **)&counter, sizeof *counter));
    if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
        reply_error("cublasCreate", "failed");
        return 1;
    }
    const char *checks = odd_sizes(1);
    printf("{\"ready\": true, \"sgemm_n\": %d, \"checks\": ", N);
    if (checks) json_string(checks);
    else printf("null");
    printf("}\n");
    fflush(stdout);
    char line[256], cmd[32], row[96];
    unsigned seed;
    double seconds;
    while (fgets(line, sizeof line, stdin)) {
        int n = sscanf(line, "%31s %95s %u %lf", cmd, row, &seed, &seconds);
        if (n <= 0) continue;
        if (!strcmp(cmd, "quit")) break;
        char dir[8], kind[16];
        unsigned long long bytes;
        if (strcmp(cmd, "window") || n != 4) reply_error(line, "unknown command");
        else if (!strcmp(row, "launch")) launch_window(seed, seconds);
        else if (!strcmp(row, "sgemm")) sgemm_window(seed, seconds);
        else if (sscanf(row, "%7[^:]:%llu:%15s", dir, &bytes, kind) == 3 && bytes > 0 &&
                 (!strcmp(dir, "h2d") || !strcmp(dir, "d2h")) &&
                 (!strcmp(kind, "pageable") || !strcmp(kind, "pinned")))
            copy_window(!strcmp(dir, "h2d"), !strcmp(kind, "pinned"), (size_t)bytes, seed, seconds);
        else reply_error(row, "unknown row");
    }
    cublasDestroy(handle);
    return 0;
}
