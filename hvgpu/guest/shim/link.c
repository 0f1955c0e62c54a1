/* Driver entry points of the JIT linker: cuLinkCreate, cuLinkAddData, cuLinkAddFile,
 * cuLinkComplete, cuLinkDestroy.
 *
 * The guest has no driver, so the link is done on the host (LINK), whole: the state is
 * kept here (the options, a copy of each input) and sent at cuLinkComplete. A file is
 * read here and travels as bytes: no guest path reaches the host. The output options
 * (log buffers and their sizes, the wall time) are the program's memory: written here
 * from the reply, as the driver writes them (a log NUL-terminated and cut at its
 * buffer's size, the size option's value overwritten with the bytes filled, the wall
 * time as a float in its option value's slot). The linked cubin is fetched into memory
 * of this process (LINK_IMAGE), valid until cuLinkDestroy.
 *
 * Not as the driver: an input the linker refuses (bad PTX) is reported by
 * cuLinkComplete, not by the cuLinkAddData that gave it; per-input options are refused.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

enum { WALL_TIME = 2, INFO_LOG = 3, INFO_SIZE = 4, ERROR_LOG = 5, ERROR_SIZE = 6 };
enum { MAX_NAME = 256 };

typedef struct { uint32_t option, reserved; uint64_t value; } hv_link_option;
typedef struct { uint32_t type, reserved; uint64_t size; } hv_link_input;
_Static_assert(sizeof(hv_link_option) == HVGPU_LINK_OPTION_SIZE &&
               sizeof(hv_link_input) == HVGPU_LINK_INPUT_SIZE, "the wire's layouts");

typedef struct hv_link_state {
    int device;
    void **values;                    /* the program's option values: outputs go there */
    int wall, info_size, error_size;  /* their indices; -1: not asked for */
    char *info, *error;               /* the program's log buffers */
    unsigned info_cap, error_cap;
    unsigned n_options;
    hv_link_option options[HVGPU_MAX_LINK_OPTIONS];
    unsigned n_inputs;
    hv_link_input inputs[HVGPU_MAX_LINK_INPUTS];
    char *names[HVGPU_MAX_LINK_INPUTS];
    unsigned char *data[HVGPU_MAX_LINK_INPUTS];
    uint64_t bytes;
    void *image;                      /* cuLinkComplete's cubin, until cuLinkDestroy */
} hv_link_state;

HV_EXPORT CUresult cuLinkCreate_v2(unsigned n, int *options, void **values, void **state_out) {
    if (!state_out || (n && (!options || !values))) return CUDA_ERROR_INVALID_VALUE;
    if (n > HVGPU_MAX_LINK_OPTIONS) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cuInit(0);
    if (r) return r;
    hv_link_state *s = calloc(1, sizeof *s);
    if (!s) return CUDA_ERROR_OUT_OF_MEMORY;
    s->device = hv_routed_device();
    s->values = values;
    s->wall = s->info_size = s->error_size = -1;
    for (unsigned i = 0; i < n; i++) {
        uint64_t v = (uint64_t)(uintptr_t)values[i];
        switch (options[i]) {
        case WALL_TIME: s->wall = (int)i; break;
        case INFO_LOG: s->info = values[i]; break;
        case ERROR_LOG: s->error = values[i]; break;
        case INFO_SIZE: s->info_size = (int)i; s->info_cap = (unsigned)v; break;
        case ERROR_SIZE: s->error_size = (int)i; s->error_cap = (unsigned)v; break;
        default: /* the executor judges the rest (jit_policy.py) */
            s->options[s->n_options++] = (hv_link_option){ (uint32_t)options[i], 0, v };
        }
    }
    *state_out = s;
    return CUDA_SUCCESS;
}

static CUresult add(hv_link_state *s, int type, const void *data, size_t size,
                    const char *name, unsigned n_options) {
    static int once;
    if (!s || !data || !size) return CUDA_ERROR_INVALID_VALUE;
    if (n_options) return hv_unsupported("cuLinkAddData with options of its own", &once);
    if (s->image) return CUDA_ERROR_INVALID_VALUE; /* already complete */
    if (s->n_inputs >= HVGPU_MAX_LINK_INPUTS || size > HVGPU_MAX_LINK_BYTES - s->bytes)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned char *copy = malloc(size);
    char *n = strndup(name ? name : "", MAX_NAME);
    if (!copy || !n) { free(copy); free(n); return CUDA_ERROR_OUT_OF_MEMORY; }
    memcpy(copy, data, size);
    unsigned i = s->n_inputs++;
    s->inputs[i] = (hv_link_input){ (uint32_t)type, 0, size };
    s->data[i] = copy;
    s->names[i] = n;
    s->bytes += size;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuLinkAddData_v2(void *state, int type, void *data, size_t size,
                                    const char *name, unsigned n_options, int *options,
                                    void **values) {
    (void)options; (void)values;
    return add(state, type, data, size, name, n_options);
}

HV_EXPORT CUresult cuLinkAddFile_v2(void *state, int type, const char *path, unsigned n_options,
                                    int *options, void **values) {
    (void)options; (void)values;
    if (!state || !path) return CUDA_ERROR_INVALID_VALUE;
    FILE *f = fopen(path, "rb"); /* the guest's file, read here */
    if (!f) return CUDA_ERROR_FILE_NOT_FOUND;
    unsigned char *buf = NULL;
    size_t len = 0, cap = 0;
    CUresult r = CUDA_SUCCESS;
    for (;;) {
        if (len == cap) {
            if (cap >= HVGPU_MAX_LINK_BYTES) { r = CUDA_ERROR_INVALID_VALUE; break; }
            unsigned char *more = realloc(buf, cap = cap ? cap * 2 : 1 << 16);
            if (!more) { r = CUDA_ERROR_OUT_OF_MEMORY; break; }
            buf = more;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (!got) break;
    }
    if (!r && ferror(f)) r = CUDA_ERROR_FILE_NOT_FOUND;
    fclose(f);
    if (!r) {
        const char *base = strrchr(path, '/');
        /* PTX is text: the driver reads it up to its NUL, which a file has not */
        if (type == 1 && len < cap) buf[len++] = 0;
        r = add(state, type, buf, len, base ? base + 1 : path, n_options);
    }
    free(buf);
    return r;
}

static void give_log(char *buf, unsigned cap, void **size_slot, const hvgpu_span_t *text) {
    if (buf && cap) {
        unsigned n = text->len < cap - 1 ? text->len : cap - 1;
        memcpy(buf, text->data, n);
        buf[n] = 0;
        if (size_slot) *size_slot = (void *)(uintptr_t)(n ? n + 1 : 0);
    } else if (size_slot) {
        *size_slot = (void *)(uintptr_t)0;
    }
}

HV_EXPORT CUresult cuLinkComplete(void *state, void **cubin, size_t *size) {
    hv_link_state *s = state;
    if (!s || !cubin || !size) return CUDA_ERROR_INVALID_VALUE;
    if (s->image) { *cubin = s->image; return CUDA_ERROR_INVALID_VALUE; }
    if (!s->n_inputs) return CUDA_ERROR_INVALID_VALUE; /* nothing to link */
    size_t names = 0;
    for (unsigned i = 0; i < s->n_inputs; i++) names += strlen(s->names[i]) + 1;
    size_t body_len = sizeof(hvgpu_link_req_t) + s->n_options * sizeof(hv_link_option) +
                      s->n_inputs * sizeof(hv_link_input) + names - 1;
    unsigned char *body = malloc(body_len), *payload = malloc(s->bytes);
    size_t rep_cap = sizeof(hvgpu_link_rep_t) + 2 * HVGPU_MAX_LINK_LOG;
    unsigned char *rep = malloc(rep_cap);
    CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
    if (!body || !payload || !rep) goto out;
    hvgpu_link_req_t q = { (uint32_t)(s->n_options * sizeof(hv_link_option)),
                           (uint32_t)(s->n_inputs * sizeof(hv_link_input)),
                           (uint32_t)(names - 1) };
    unsigned char *p = body;
    memcpy(p, &q, sizeof q); p += sizeof q;
    memcpy(p, s->options, q.options_len); p += q.options_len;
    memcpy(p, s->inputs, q.inputs_len); p += q.inputs_len;
    for (unsigned i = 0, at = 0; i < s->n_inputs; i++) {
        size_t n = strlen(s->names[i]);
        memcpy(p, s->names[i], n); p += n;
        if (i + 1 < s->n_inputs) *p++ = 0;
        memcpy(payload + at, s->data[i], s->inputs[i].size);
        at += (unsigned)s->inputs[i].size;
    }
    uint32_t n = 0;
    r = HV_ON(s->device, hv_call(HVGPU_OP_LINK, body, (uint32_t)body_len, payload, s->bytes, rep,
                                 (uint32_t)rep_cap, &n, NULL, 0));
    if (r) goto out;
    hvgpu_link_rep_view_t v;
    hvgpu_link_rep_decode(rep, n, &v);
    give_log(s->info, s->info_cap, s->info_size >= 0 ? &s->values[s->info_size] : NULL,
             &v.info_log);
    give_log(s->error, s->error_cap, s->error_size >= 0 ? &s->values[s->error_size] : NULL,
             &v.error_log);
    if (s->wall >= 0) { /* a float in the option value's slot, as the driver writes it */
        s->values[s->wall] = NULL;
        memcpy(&s->values[s->wall], &v.fixed.wall_ms, sizeof(float));
    }
    r = (CUresult)v.fixed.status;
    if (r) goto out;
    void *image = malloc(v.fixed.size ? v.fixed.size : 1);
    if (!image) { r = CUDA_ERROR_OUT_OF_MEMORY; goto out; }
    hvgpu_link_image_req_t iq = { v.fixed.image };
    r = HV_ON(s->device, hv_call(HVGPU_OP_LINK_IMAGE, &iq, sizeof iq, NULL, 0, NULL, 0, NULL,
                                 image, v.fixed.size));
    if (r) { free(image); goto out; }
    s->image = image;
    *cubin = image;
    *size = (size_t)v.fixed.size;
out:
    free(body);
    free(payload);
    free(rep);
    return r;
}

HV_EXPORT CUresult cuLinkDestroy(void *state) {
    hv_link_state *s = state;
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    for (unsigned i = 0; i < s->n_inputs; i++) { free(s->data[i]); free(s->names[i]); }
    free(s->image);
    free(s);
    return CUDA_SUCCESS;
}

/* The first signatures, the same arguments. */
HV_EXPORT CUresult cuLinkCreate(unsigned n, int *options, void **values, void **state) {
    return cuLinkCreate_v2(n, options, values, state);
}
HV_EXPORT CUresult cuLinkAddData(void *state, int type, void *data, size_t size, const char *name,
                                 unsigned n_options, int *options, void **values) {
    return cuLinkAddData_v2(state, type, data, size, name, n_options, options, values);
}
HV_EXPORT CUresult cuLinkAddFile(void *state, int type, const char *path, unsigned n_options,
                                 int *options, void **values) {
    return cuLinkAddFile_v2(state, type, path, n_options, options, values);
}
