/* A module's and a library's functions found without their names, as a library that
 * loads an image and looks its kernels over does (cuModuleGetFunctionCount,
 * cuModuleEnumerateFunctions, cuLibraryGetKernelCount, cuLibraryEnumerateKernels):
 * the count, each function's name (sorted: the driver's order is its own), a launch of
 * one found that way, and what a short array gets. Prints the same natively and
 * through the shim. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call) do { CUresult r_ = (call); if (r_) { \
    printf("%s: %d\n", #call, r_); return 1; } } while (0)

static const char PTX[] =
    ".version 7.0\n.target sm_52\n.address_size 64\n"
    ".visible .entry add_one(.param .u64 add_one_p)\n{\n"
    ".reg .b32 %r<3>;\n.reg .b64 %rd<3>;\n"
    "ld.param.u64 %rd1, [add_one_p];\ncvta.to.global.u64 %rd2, %rd1;\n"
    "ld.global.u32 %r1, [%rd2];\nadd.s32 %r2, %r1, 1;\nst.global.u32 [%rd2], %r2;\nret;\n}\n"
    ".visible .entry set_seven(.param .u64 set_seven_p)\n{\n"
    ".reg .b32 %r<2>;\n.reg .b64 %rd<3>;\n"
    "ld.param.u64 %rd1, [set_seven_p];\ncvta.to.global.u64 %rd2, %rd1;\n"
    "mov.u32 %r1, 7;\nst.global.u32 [%rd2], %r1;\nret;\n}\n";

static int by_name(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* names of n functions, sorted, on one line; the one named `want` in *found */
static void show(const char *what, CUfunction *fs, unsigned n, const char *want,
                 CUfunction *found) {
    const char *names[16];
    for (unsigned i = 0; i < n && i < 16; i++) {
        if (cuFuncGetName(&names[i], fs[i])) names[i] = "?";
        if (!strcmp(names[i], want)) *found = fs[i];
    }
    qsort(names, n, sizeof names[0], by_name);
    printf("%s:", what);
    for (unsigned i = 0; i < n; i++) printf(" %s", names[i]);
    printf("\n");
}

/* The driver's private tools table that cuFFT finds its kernels with: slot 7 calls back
   once per function of a module and returns how many. */
static const CUuuid TOOLS_MODULE = { { 0x6e, 0x16, 0x3f, 0xbe, 0xb9, 0x58, 0x44, 0x4d,
                                       0x83, 0x5c, 0xe1, 0x82, 0xaf, 0xf1, 0x99, 0x1e } };
typedef long (*each_function)(CUcontext, CUmodule, void (*)(void *, CUfunction, unsigned long long),
                              void *, void *, void *);
static struct { CUfunction fs[16]; unsigned n; } seen;

static void collect(void *opaque, CUfunction f, unsigned long long owner) {
    (void)owner;
    if (opaque == &seen && seen.n < 16) seen.fs[seen.n++] = f;
}

static int run(CUfunction f, CUdeviceptr d, unsigned *value) {
    void *args[] = { &d };
    CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, 0, args, NULL));
    CHECK(cuMemcpyDtoH(value, d, sizeof *value));
    return 0;
}

int main(void) {
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUlibrary lib;
    CUdeviceptr d;
    unsigned count = 0, value = 0, zero = 0;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuMemAlloc(&d, sizeof zero));
    CHECK(cuMemcpyHtoD(d, &zero, sizeof zero));

    CHECK(cuModuleLoadData(&mod, PTX));
    CHECK(cuModuleGetFunctionCount(&count, mod));
    printf("module functions: %u\n", count);
    CUfunction fs[16], add = NULL, set = NULL;
    printf("a short array: %d\n", cuModuleEnumerateFunctions(fs, 1, mod));
    CHECK(cuModuleEnumerateFunctions(fs, count, mod));
    show("module", fs, count, "add_one", &add);
    if (!add || run(add, d, &value)) return 1;
    printf("add_one found by enumeration: %u\n", value);
    printf("a null module: %d\n", cuModuleGetFunctionCount(&count, NULL));

    const void *const *table;
    CHECK(cuGetExportTable((const void **)&table, &TOOLS_MODULE));
    long n = ((each_function)table[7])(ctx, mod, collect, &seen, NULL, NULL);
    CUfunction again_add = NULL;
    show("tools table", seen.fs, seen.n, "add_one", &again_add);
    printf("tools table returned %ld\n", n);
    if (!again_add || run(again_add, d, &value)) return 1;
    printf("add_one found by the tools table: %u\n", value);

    CHECK(cuLibraryLoadData(&lib, PTX, NULL, NULL, 0, NULL, NULL, 0));
    CHECK(cuLibraryGetKernelCount(&count, lib));
    printf("library kernels: %u\n", count);
    CUkernel ks[16];
    CHECK(cuLibraryEnumerateKernels(ks, count, lib));
    show("library", (CUfunction *)ks, count, "set_seven", &set);
    CUkernel again;
    CHECK(cuLibraryGetKernel(&again, lib, "set_seven"));
    printf("enumerated kernel is cuLibraryGetKernel's: %s\n",
           (CUfunction)again == set ? "yes" : "no");
    CUfunction f;
    CHECK(cuKernelGetFunction(&f, again));
    if (run(f, d, &value)) return 1;
    printf("set_seven found by enumeration: %u\n", value);
    CHECK(cuLibraryUnload(lib));
    CHECK(cuModuleUnload(mod));
    CHECK(cuMemFree(d));
    printf("enumerate: ok\n");
    return 0;
}
