/* The executor's hot loop for pipelined kernel launches.
 *
 * A guest that launches in a loop sends runs of one-way LAUNCH_KERNEL frames;
 * the session's Python loop costs more per frame than the launch itself.
 * hv_burst_run walks such a run in the session's receive buffer and calls the
 * launch entry point it was given (libcuda's cuLaunchKernel, or the test
 * double's) once per frame, checking exactly what the Python path checks: the
 * frame is a well-formed one-way LAUNCH_KERNEL of this connection's version,
 * the function and stream handles belong to this guest, the parameter buffer
 * has the size the kernel takes.
 *
 * It stops, leaving the frame unread, at the first frame it does not serve
 * (another op, an unknown handle, a wrong size, an incomplete frame) so the
 * Python session handles that one with its full checks and error messages.
 * It stops after a frame whose launch failed and reports the status and seq.
 *
 * Plain C loaded with ctypes: no Python API, no CUDA headers, no sockets.
 * It must not decide anything the session does not already decide.
 */

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define HV_EXPORT __attribute__((visibility("default")))

enum {
    HEADER_SIZE = 32,
    MAGIC = 0x4748,
    OP_LAUNCH_KERNEL = 0x35,
    FLAG_ONEWAY = 0x01,
    LAUNCH_FIXED = 48, /* u64 function, 7 x u32, u64 stream, u32 params length */
    MAX_PARAMS = 32768,
};

typedef int (*launch_entry)(void *function, unsigned gx, unsigned gy, unsigned gz,
                            unsigned bx, unsigned by, unsigned bz, unsigned shared_mem,
                            void *stream, void **kernel_params, void **extra);

/* Guest handle -> host value; open addressing, linear probing. */
struct slot {
    uint64_t key, value;
    uint32_t size;
    uint32_t used;
};

struct table {
    struct slot *slots;
    uint64_t mask, count;
};

struct burst {
    launch_entry entry;
    struct table functions, streams;
    /* CUDA reads the parameter buffer through a pointer; kept aligned for it. */
    _Alignas(64) unsigned char params[MAX_PARAMS];
};

struct burst_result {
    uint64_t consumed;  /* bytes of buf taken: whole frames only */
    uint64_t launched;  /* frames launched successfully */
    int32_t status;     /* 0, or the failed launch's CUresult */
    uint32_t seq;       /* the failed frame's seq */
};

static uint64_t mix(uint64_t key)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    return key ^ (key >> 33);
}

static struct slot *find(const struct table *t, uint64_t key)
{
    if (!t->slots)
        return NULL;
    for (uint64_t i = mix(key) & t->mask;; i = (i + 1) & t->mask) {
        struct slot *s = &t->slots[i];
        if (!s->used)
            return NULL;
        if (s->key == key)
            return s;
    }
}

static int grow(struct table *t)
{
    uint64_t cap = t->slots ? (t->mask + 1) * 2 : 64;
    struct slot *old = t->slots, *fresh = calloc(cap, sizeof *fresh);
    if (!fresh)
        return -1;
    uint64_t old_cap = old ? t->mask + 1 : 0;
    t->slots = fresh;
    t->mask = cap - 1;
    for (uint64_t i = 0; i < old_cap; i++) {
        if (!old[i].used)
            continue;
        uint64_t j = mix(old[i].key) & t->mask;
        while (fresh[j].used)
            j = (j + 1) & t->mask;
        fresh[j] = old[i];
    }
    free(old);
    return 0;
}

static int put(struct table *t, uint64_t key, uint64_t value, uint32_t size)
{
    struct slot *s = find(t, key);
    if (!s) {
        if ((t->count + 1) * 2 > (t->slots ? t->mask + 1 : 0) && grow(t))
            return -1;
        uint64_t i = mix(key) & t->mask;
        while (t->slots[i].used)
            i = (i + 1) & t->mask;
        s = &t->slots[i];
        s->used = 1;
        s->key = key;
        t->count++;
    }
    s->value = value;
    s->size = size;
    return 0;
}

static void drop(struct table *t, uint64_t key)
{
    struct slot *s = find(t, key);
    if (!s)
        return;
    /* Backward-shift deletion keeps every probe chain unbroken without tombstones. */
    uint64_t hole = (uint64_t)(s - t->slots);
    t->slots[hole].used = 0;
    t->count--;
    for (uint64_t i = (hole + 1) & t->mask; t->slots[i].used; i = (i + 1) & t->mask) {
        uint64_t home = mix(t->slots[i].key) & t->mask;
        /* Move the entry into the hole unless its home lies cyclically in (hole, i]. */
        int stays = hole <= i ? (home > hole && home <= i) : (home > hole || home <= i);
        if (!stays) {
            t->slots[hole] = t->slots[i];
            t->slots[i].used = 0;
            hole = i;
        }
    }
}

HV_EXPORT struct burst *hv_burst_new(void *entry)
{
    struct burst *b = aligned_alloc(64, sizeof *b);
    if (!b)
        return NULL;
    memset(b, 0, offsetof(struct burst, params));
    b->entry = (launch_entry)entry;
    return b;
}

HV_EXPORT void hv_burst_free(struct burst *b)
{
    if (!b)
        return;
    free(b->functions.slots);
    free(b->streams.slots);
    free(b);
}

HV_EXPORT int hv_burst_set_function(struct burst *b, uint64_t handle, uint64_t function,
                                    uint32_t params_size)
{
    return put(&b->functions, handle, function, params_size);
}

HV_EXPORT void hv_burst_drop_function(struct burst *b, uint64_t handle)
{
    drop(&b->functions, handle);
}

HV_EXPORT int hv_burst_set_stream(struct burst *b, uint64_t handle, uint64_t stream)
{
    return put(&b->streams, handle, stream, 0);
}

HV_EXPORT void hv_burst_drop_stream(struct burst *b, uint64_t handle)
{
    drop(&b->streams, handle);
}

#define GET(type, at) ({ type v_; memcpy(&v_, (at), sizeof v_); v_; })

HV_EXPORT void hv_burst_run(struct burst *b, const unsigned char *buf, uint64_t len,
                            uint32_t version, uint32_t max_body, struct burst_result *out)
{
    uint64_t at = 0, launched = 0;
    out->status = 0;
    out->seq = 0;
    while (len - at >= HEADER_SIZE) {
        const unsigned char *h = buf + at;
        uint32_t body_len = GET(uint32_t, h + 16);
        if (GET(uint16_t, h) != MAGIC || h[2] != version || h[3] != FLAG_ONEWAY ||
            GET(uint16_t, h + 4) != OP_LAUNCH_KERNEL || GET(uint64_t, h + 24) != 0 ||
            body_len > max_body || body_len < LAUNCH_FIXED || len - at - HEADER_SIZE < body_len)
            break;
        const unsigned char *body = h + HEADER_SIZE;
        uint32_t n = GET(uint32_t, body + 44);
        if ((uint64_t)LAUNCH_FIXED + n != body_len)
            break;
        const struct slot *fn = find(&b->functions, GET(uint64_t, body));
        const struct slot *stream = find(&b->streams, GET(uint64_t, body + 36));
        if (!fn || !stream || fn->size != n || n > MAX_PARAMS)
            break;
        size_t size = n;
        void *extra[] = {(void *)1, b->params, (void *)2, &size, (void *)0};
        if (n)
            memcpy(b->params, body + LAUNCH_FIXED, n);
        int status = b->entry((void *)(uintptr_t)fn->value, GET(uint32_t, body + 8),
                              GET(uint32_t, body + 12), GET(uint32_t, body + 16),
                              GET(uint32_t, body + 20), GET(uint32_t, body + 24),
                              GET(uint32_t, body + 28), GET(uint32_t, body + 32),
                              (void *)(uintptr_t)stream->value, NULL, n ? extra : NULL);
        at += HEADER_SIZE + body_len;
        if (status) {
            out->status = status;
            out->seq = GET(uint32_t, h + 8);
            break;
        }
        launched++;
    }
    out->consumed = at;
    out->launched = launched;
}
