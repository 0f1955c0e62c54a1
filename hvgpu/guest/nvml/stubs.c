/* Every NVML entry point nvml.h declares (nvml_api.def), as a weak fallback: one
 * nvml.c answers replaces it at link time; the rest return
 * NVML_ERROR_NOT_SUPPORTED, so a tool gets the answer a GPU without the feature
 * gives instead of a missing symbol. Monitors call many of them on every poll,
 * so they say so on stderr only under HVGPU_SHIM_TRACE, once each.
 *
 * Deliberately includes no prototypes: the fallbacks ignore their arguments.
 */
int hv_trace_enabled(void);
void hv_log(const char *fmt, ...);

#define NVML_ERROR_NOT_SUPPORTED 3

static int unsupported(const char *name, int *once) {
    if (hv_trace_enabled() && !__atomic_exchange_n(once, 1, __ATOMIC_RELAXED))
        hv_log("%s is not answered by the hvgpu NVML library: NVML_ERROR_NOT_SUPPORTED", name);
    return NVML_ERROR_NOT_SUPPORTED;
}

#define NVML_API(sym)                                                          \
    __attribute__((weak, visibility("default"))) int sym(void) {              \
        static int once;                                                       \
        return unsupported(#sym, &once);                                       \
    }
#include "nvml_api.def"
#undef NVML_API
