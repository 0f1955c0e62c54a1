/* cuGetProcAddress, and the list of what the shim implements.
 *
 * The runtime finds almost every driver function by name and API version
 * through cuGetProcAddress; IMPLEMENTED maps each (name, first version) to
 * the shim's function with that version's signature. Known names without an
 * implementation resolve to their NOT_SUPPORTED fallback (stubs.c); unknown
 * names are reported not found, as a driver that predates them would.
 * `hvgpu-guest coverage` reads the same table through hvgpu_shim_coverage.
 */
#define _GNU_SOURCE
#include <string.h>

/* No shim.h: the table below declares each entry point without its prototype. */
typedef int CUresult;
#define HV_EXPORT __attribute__((visibility("default")))
#define HVGPU_WIRE_CUDA_NAMES
#include "hvgpu_wire.h" /* the statuses */
const char *hv_agent_address(void);
int hv_trace_enabled(void);
void hv_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

struct hv_known { const char *api, *symbol; void *fn; };
const struct hv_known *hv_known(size_t *n);

#define F(sym) extern int sym(void);
#define E(api, version, sym) F(sym)
#include "implemented.def"
#undef E
#undef F

static const struct { const char *api; int version; void *fn; const char *symbol; } IMPLEMENTED[] = {
#define E(api, version, sym) { #api, version, (void *)sym, #sym },
#include "implemented.def"
#undef E
};
#define N_IMPLEMENTED (sizeof IMPLEMENTED / sizeof *IMPLEMENTED)

enum { SYMBOL_SUCCESS = 0, SYMBOL_NOT_FOUND = 1, VERSION_NOT_SUFFICIENT = 2 };

/* cuGetProcAddress itself lives in device.c, whose prototypes this file must not see. */
CUresult hv_lookup(const char *symbol, void **pfn, int version, int *status) {
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    int best = -1, known = 0;
    for (size_t i = 0; i < N_IMPLEMENTED; i++) {
        if (strcmp(IMPLEMENTED[i].api, symbol)) continue;
        known = 1;
        if (IMPLEMENTED[i].version <= version &&
            (best < 0 || IMPLEMENTED[i].version > IMPLEMENTED[best].version))
            best = (int)i;
    }
    if (hv_trace_enabled() > 1)
        hv_log("cuGetProcAddress(%s, %d): %s", symbol, version,
               best >= 0 ? IMPLEMENTED[best].symbol : known ? "only for newer versions" : "-");
    if (best >= 0) {
        *pfn = IMPLEMENTED[best].fn;
        if (status) *status = SYMBOL_SUCCESS;
        return CUDA_SUCCESS;
    }
    size_t n;
    const struct hv_known *k = hv_known(&n);
    if (hv_trace_enabled()) hv_log("cuGetProcAddress(%s, %d): not implemented", symbol, version);
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(k[i].api, symbol)) {
            /* Known to CUDA but not built here (or only for newer versions). */
            *pfn = known ? NULL : k[i].fn;
            if (status) *status = known ? VERSION_NOT_SUFFICIENT : SYMBOL_SUCCESS;
            return known ? CUDA_ERROR_NOT_FOUND : CUDA_SUCCESS;
        }
    }
    *pfn = NULL;
    if (status) *status = SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
}

/* For `hvgpu-guest coverage`: entry i of every known name; 0 past the end. */
HV_EXPORT int hvgpu_shim_coverage(int i, const char **api, const char **symbol, int *implemented) {
    size_t n;
    const struct hv_known *k = hv_known(&n);
    if (i < 0 || (size_t)i >= n) return 0;
    *api = k[i].api;
    *symbol = k[i].symbol;
    *implemented = 0;
    for (size_t j = 0; j < N_IMPLEMENTED; j++)
        if (!strcmp(IMPLEMENTED[j].symbol, k[i].symbol)) *implemented = 1;
    return 1;
}

HV_EXPORT const char *hvgpu_shim_agent(void) { return hv_agent_address(); }
