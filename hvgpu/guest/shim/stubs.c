/* Every driver entry point of CUDA's cuda.h (driver_api.def), as a weak
 * fallback: one the shim implements elsewhere replaces it at link time; the
 * rest say once which program call is missing and return
 * CUDA_ERROR_NOT_SUPPORTED, so a program gets an error it can report instead
 * of a missing symbol or a crash.
 *
 * Deliberately includes no prototypes: the fallbacks ignore their arguments.
 */
#include <stddef.h>

int hv_unsupported(const char *api, int *once);

#define HVGPU_API(api, sym)                                                    \
    __attribute__((weak, visibility("default"))) int sym(void) {              \
        static int once;                                                       \
        return hv_unsupported(#api, &once);                                    \
    }
#include "driver_api.def"
#undef HVGPU_API

struct hv_known {
    const char *api, *symbol;
    void *fn;
};

#define HVGPU_API(api, sym) { #api, #sym, (void *)sym },
static const struct hv_known KNOWN[] = {
#include "driver_api.def"
};
#undef HVGPU_API

const struct hv_known *hv_known(size_t *n) {
    *n = sizeof KNOWN / sizeof *KNOWN;
    return KNOWN;
}
