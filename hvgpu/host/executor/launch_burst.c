/* The executor's hot loop for pipelined one-way frames.
 *
 * A training step is a stream of one-way frames (launches, event records,
 * stream waits, memsets, small copies); the session's Python loop costs more
 * per frame than the driver call itself. hv_burst_run walks such a run in the
 * session's receive buffer and makes the driver call of each frame through
 * the entry points it was given (libcuda's, or the test double's), checking
 * exactly what the Python path checks.
 *
 * Which ops it serves and what it checks of their fields come from the
 * executor's op table (hvgpu/host/executor/ops: an op declared with burst=,
 * its checks as fields=), through launch_burst.h, which cgen generates: the
 * served ops (S_*, served_index) and, for each, its frame's shape and field
 * checks (hv_served), which check_frame applies with one routine: function,
 * stream and event handles belong to this guest; every device range it
 * touches (an address with a size field, times a width, or the payload) lies
 * inside an allocation (or module variable) of this guest; a value is one of
 * those allowed (a memset's width); a parameter buffer has the size the
 * kernel takes; launch attributes are whole and name no event. The Python
 * path's checks are derived from the same declarations (ops/fields.py).
 * Checked here by hand, as no Python check has them: the frame is a one-way
 * frame of this connection's version within the body limit, and the sizes
 * this loop's own buffers take (parameters, attributes, a ring segment).
 * The code per op below is the driver call alone, and the copy ring.
 *
 * Served: LAUNCH_KERNEL, LAUNCH_KERNEL_EX, EVENT_RECORD, STREAM_WAIT_EVENT,
 * MEMSET (1, 2, 4 bytes), MEMCPY_DTOD, and MEMCPY_HTOD whose payload is in the
 * buffer and fits a segment of the copy ring. The ring is one pinned staging
 * slot shared by the executor's sessions, cut into segments: a session holds
 * one segment at a time, copies the guest's bytes into it (so the receive
 * buffer can be reused at once) and queues the copy from there; when it lets
 * the segment go (another stream, full, or the end of the run) it records the
 * segment's event behind its copies, and whoever takes the segment next waits
 * for that event before writing into it.
 *
 * It stops, leaving the frame unread, at the first frame it does not serve
 * (another op, an unknown handle, a range it cannot vouch for, an unusual
 * size, an incomplete frame) so the Python session handles that one with its
 * full checks and error messages. It stops after a frame whose driver call
 * failed and reports the status and seq.
 *
 * Plain C loaded with ctypes: no Python API, no CUDA headers, no sockets.
 * It must not decide anything the session does not already decide.
 */

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hvgpu_wire.h" /* the frame, each op's fixed part and limits, from the protocol table */
#include "launch_burst.h" /* entry points, served ops and their checks, result: generated */

#define HV_EXPORT __attribute__((visibility("default")))

typedef int (*launch_fn)(void *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                         unsigned by, unsigned bz, unsigned shared_mem, void *stream,
                         void **kernel_params, void **extra);

struct launch_config { /* CUlaunchConfig */
    unsigned grid[3], block[3], shared_mem;
    void *stream;
    void *attrs;
    unsigned num_attrs;
};

typedef int (*launch_ex_fn)(const struct launch_config *config, void *function,
                            void **kernel_params, void **extra);
typedef int (*event_record_fn)(void *event, void *stream);
typedef int (*stream_wait_event_fn)(void *stream, void *event, unsigned flags);
typedef int (*event_synchronize_fn)(void *event);
typedef int (*memset_d8_fn)(uint64_t dst, unsigned char value, size_t count, void *stream);
typedef int (*memset_d16_fn)(uint64_t dst, unsigned short value, size_t count, void *stream);
typedef int (*memset_d32_fn)(uint64_t dst, unsigned int value, size_t count, void *stream);
typedef int (*memcpy_dtod_fn)(uint64_t dst, uint64_t src, size_t n, void *stream);
typedef int (*memcpy_htod_fn)(uint64_t dst, const void *src, size_t n, void *stream);

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

/* Device ranges the guest may touch, sorted by start. */
struct range {
    uint64_t start, size;
};

struct ranges {
    struct range *items;
    uint64_t count, cap;
};

enum { SEG_FREE, SEG_HELD, SEG_PENDING, SEG_LOST };

/* The copy ring: shared by the sessions of one executor (their threads). */
struct ring {
    pthread_mutex_t lock;
    unsigned char *base;
    uint32_t segment, count, next;
    uint32_t refs;   /* the pool's, and one per session attached */
    int closed;      /* the pool closed it: no segment is handed out any more */
    uint64_t events[MAX_SEGMENTS];
    unsigned char state[MAX_SEGMENTS];
};

struct burst {
    void *entry[N_ENTRIES];
    struct table functions, streams, events;
    struct ranges ranges;
    struct ring *ring;
    int no_ring;          /* the session has none to give: small copies go through Python */
    int32_t held;         /* the ring segment this loop holds, or -1 */
    uint32_t held_used;   /* bytes of it queued so far */
    uint64_t held_stream; /* the guest's stream handle of those copies */
    uint64_t held_value;  /* and its CUstream */
    uint32_t held_seq;    /* the last of those copies' frame */
    /* CUDA reads these through pointers; kept aligned for it. */
    _Alignas(64) unsigned char params[HVGPU_MAX_PARAMS];
    _Alignas(64) unsigned char attrs[HVGPU_MAX_LAUNCH_ATTRS * HVGPU_LAUNCH_ATTR_SIZE];
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

/* The index of the first range starting after ptr. */
static uint64_t after(const struct ranges *r, uint64_t ptr)
{
    uint64_t lo = 0, hi = r->count;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (r->items[mid].start <= ptr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int range_put(struct ranges *r, uint64_t start, uint64_t size)
{
    uint64_t i = after(r, start);
    if (i && r->items[i - 1].start == start) {
        r->items[i - 1].size = size;
        return 0;
    }
    if (r->count == r->cap) {
        uint64_t cap = r->cap ? r->cap * 2 : 64;
        struct range *fresh = realloc(r->items, cap * sizeof *fresh);
        if (!fresh)
            return -1;
        r->items = fresh;
        r->cap = cap;
    }
    memmove(&r->items[i + 1], &r->items[i], (r->count - i) * sizeof *r->items);
    r->items[i] = (struct range){start, size};
    r->count++;
    return 0;
}

static void range_drop(struct ranges *r, uint64_t start)
{
    uint64_t i = after(r, start);
    if (!i || r->items[i - 1].start != start)
        return;
    memmove(&r->items[i - 1], &r->items[i], (r->count - i) * sizeof *r->items);
    r->count--;
}

/* As the session's Allocations.check: [ptr, ptr + n) inside the range that starts
   last at or before ptr. */
static int inside(const struct ranges *r, uint64_t ptr, uint64_t n)
{
    uint64_t i = after(r, ptr);
    if (!i)
        return 0;
    const struct range *a = &r->items[i - 1];
    uint64_t off = ptr - a->start;
    return off <= a->size && n <= a->size - off;
}

/* -- the copy ring ---------------------------------------------------------- */

HV_EXPORT struct ring *hv_ring_new(void *base, uint32_t segment, uint32_t count,
                                   const uint64_t *events)
{
    if (!base || !segment || !count || count > MAX_SEGMENTS)
        return NULL;
    struct ring *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    if (pthread_mutex_init(&r->lock, NULL)) {
        free(r);
        return NULL;
    }
    r->base = base;
    r->segment = segment;
    r->count = count;
    r->refs = 1;
    memcpy(r->events, events, count * sizeof *events);
    return r;
}

static void ring_unref(struct ring *r)
{
    pthread_mutex_lock(&r->lock);
    int last = --r->refs == 0;
    pthread_mutex_unlock(&r->lock);
    if (last) {
        pthread_mutex_destroy(&r->lock);
        free(r);
    }
}

/* Hands out no more segments; how many are still held (0: its memory may go). */
HV_EXPORT uint32_t hv_ring_close(struct ring *r)
{
    pthread_mutex_lock(&r->lock);
    r->closed = 1;
    uint32_t held = 0;
    for (uint32_t i = 0; i < r->count; i++)
        held += r->state[i] == SEG_HELD;
    pthread_mutex_unlock(&r->lock);
    ring_unref(r);
    return held;
}

/* A segment for this loop alone, its last copies done; -1 when none is to be had. */
static int32_t ring_take(struct burst *b)
{
    struct ring *r = b->ring;
    int32_t got = -1;
    int pending = 0;
    pthread_mutex_lock(&r->lock);
    for (uint32_t k = 0; !r->closed && k < r->count; k++) {
        uint32_t i = (r->next + k) % r->count;
        if (r->state[i] == SEG_FREE || r->state[i] == SEG_PENDING) {
            pending = r->state[i] == SEG_PENDING;
            r->state[i] = SEG_HELD;
            r->next = (i + 1) % r->count;
            got = (int32_t)i;
            break;
        }
    }
    pthread_mutex_unlock(&r->lock);
    if (got >= 0 && pending)
        /* A failure here is the earlier copy's, and that copy's stream reports it;
           the segment is free either way (as staging.py does). */
        ((event_synchronize_fn)b->entry[E_cuEventSynchronize])(
            (void *)(uintptr_t)r->events[got]);
    return got;
}

/* Lets the held segment go, its event recorded behind its copies; the status of that
   record (a segment whose record failed is never handed out again). */
static int ring_release(struct burst *b)
{
    struct ring *r = b->ring;
    int32_t i = b->held;
    int status = 0;
    unsigned char state = SEG_FREE;
    if (b->held_used) {
        status = ((event_record_fn)b->entry[E_cuEventRecord])(
            (void *)(uintptr_t)r->events[i], (void *)(uintptr_t)b->held_value);
        state = status ? SEG_LOST : SEG_PENDING;
    }
    pthread_mutex_lock(&r->lock);
    r->state[i] = state;
    pthread_mutex_unlock(&r->lock);
    b->held = -1;
    b->held_used = 0;
    return status;
}

/* -- the loop's state -------------------------------------------------------- */

HV_EXPORT struct burst *hv_burst_new(void *const *entries, uint32_t count)
{
    struct burst *b = aligned_alloc(64, sizeof *b);
    if (!b)
        return NULL;
    memset(b, 0, offsetof(struct burst, params));
    for (uint32_t i = 0; i < count && i < N_ENTRIES; i++)
        b->entry[i] = entries[i];
    b->held = -1;
    return b;
}

HV_EXPORT void hv_burst_free(struct burst *b)
{
    if (!b)
        return;
    if (b->ring) {
        if (b->held >= 0)
            ring_release(b);
        ring_unref(b->ring);
    }
    free(b->functions.slots);
    free(b->streams.slots);
    free(b->events.slots);
    free(b->ranges.items);
    free(b);
}

/* ring: the executor's copy ring (the loop keeps a reference), or NULL: small copies
   go through the Python path for good. */
HV_EXPORT void hv_burst_set_ring(struct burst *b, struct ring *ring)
{
    if (b->ring || b->no_ring)
        return;
    if (!ring || !b->entry[E_cuMemcpyHtoDAsync] || !b->entry[E_cuEventRecord] ||
        !b->entry[E_cuEventSynchronize]) {
        b->no_ring = 1;
        return;
    }
    pthread_mutex_lock(&ring->lock);
    ring->refs++;
    pthread_mutex_unlock(&ring->lock);
    b->ring = ring;
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

HV_EXPORT int hv_burst_set_event(struct burst *b, uint64_t handle, uint64_t event)
{
    return put(&b->events, handle, event, 0);
}

HV_EXPORT void hv_burst_drop_event(struct burst *b, uint64_t handle)
{
    drop(&b->events, handle);
}

HV_EXPORT int hv_burst_add_range(struct burst *b, uint64_t start, uint64_t size)
{
    return range_put(&b->ranges, start, size);
}

HV_EXPORT void hv_burst_drop_range(struct burst *b, uint64_t start)
{
    range_drop(&b->ranges, start);
}

/* -- serving ------------------------------------------------------------------ */

#define GET(type, at) ({ type v_; memcpy(&v_, (at), sizeof v_); v_; })
/* A field of a packed wire struct read from unaligned bytes: FIELD(body, type_t, name). */
#define FIELD(at, st, name) \
    GET(__typeof__(((st *)0)->name), (const unsigned char *)(at) + offsetof(st, name))
#define VALUE(s) ((void *)(uintptr_t)(s)->value)

/* What serving one frame came to. */
enum { LEFT, DONE };

struct frame {
    const unsigned char *body;
    uint32_t body_len;
    uint64_t payload_len;
    uint32_t seq;
};

/* What a frame's field checks found, for its driver call. */
struct checked {
    const struct slot *function, *stream, *event;
    const unsigned char *var[HV_MAX_VARS]; /* each variable field's bytes */
    uint32_t var_len[HV_MAX_VARS];
};

/* A field of the fixed part, `width` bytes at `at`, as a number. */
static uint64_t field(const unsigned char *body, uint16_t at, uint8_t width)
{
    switch (width) {
    case 1: return body[at];
    case 2: return GET(uint16_t, body + at);
    case 4: return GET(uint32_t, body + at);
    default: return GET(uint64_t, body + at);
    }
}

/* The frame has the shape of its op's request (the fixed part, then each variable
   field, nothing after) and passes each field check the op table declares for it
   (launch_burst.h's hv_served, in the order the Python path judges them); LEFT when
   it cannot vouch for one, so the Python path judges the frame. */
static int check_frame(const struct burst *b, int index, const struct frame *f,
                       struct checked *c)
{
    const struct hv_served_op *op = &hv_served[index];
    const unsigned char *body = f->body;
    if (f->body_len < op->fixed)
        return LEFT;
    uint64_t at = op->fixed;
    for (uint8_t k = 0; k < op->n_vars; k++) {
        c->var_len[k] = GET(uint32_t, body + op->var_len[k]);
        c->var[k] = body + at;
        at += c->var_len[k];
    }
    if (at != f->body_len)
        return LEFT;
    for (uint8_t i = 0; i < op->n_checks; i++) {
        const struct hv_check *k = &op->checks[i];
        uint64_t v = field(body, k->at, k->width);
        switch (k->kind) {
        case HV_CHECK_FUNCTION:
            if (!(c->function = find(&b->functions, v)))
                return LEFT;
            break;
        case HV_CHECK_STREAM:
            if (!(c->stream = find(&b->streams, v)))
                return LEFT;
            break;
        case HV_CHECK_EVENT:
            if (!(c->event = find(&b->events, v)))
                return LEFT;
            break;
        case HV_CHECK_RANGE: {
            uint64_t n = k->size_width ? field(body, k->size_at, k->size_width) : f->payload_len;
            if (k->times_width) {
                uint64_t times = field(body, k->times_at, k->times_width);
                if (times && n > UINT64_MAX / times)
                    return LEFT;
                n *= times;
            }
            if (!inside(&b->ranges, v, n))
                return LEFT;
            break;
        }
        case HV_CHECK_ONE_OF:
            if (v >= 64 || !(k->allowed >> v & 1))
                return LEFT;
            break;
        case HV_CHECK_PARAMS: /* its function is checked before it (ops/fields.py) */
            if (v > HVGPU_MAX_PARAMS || !c->function || c->function->size != v)
                return LEFT;
            break;
        case HV_CHECK_ATTRS:
            if (v % HVGPU_LAUNCH_ATTR_SIZE || v / HVGPU_LAUNCH_ATTR_SIZE > HVGPU_MAX_LAUNCH_ATTRS)
                return LEFT;
            for (uint64_t a = 0; a < v; a += HVGPU_LAUNCH_ATTR_SIZE) {
                uint32_t id = GET(uint32_t, c->var[k->var] + a);
                if (id == HVGPU_LAUNCH_ATTR_PROGRAMMATIC_EVENT ||
                    id == HVGPU_LAUNCH_ATTR_LAUNCH_COMPLETION_EVENT)
                    return LEFT;
            }
            break;
        default:
            return LEFT;
        }
    }
    return DONE;
}

/* -- the driver calls: what each served op does once its frame is checked ------ */

typedef hvgpu_launch_kernel_req_t launch_req;
typedef hvgpu_launch_kernel_ex_req_t launch_ex_req;

static int launch(struct burst *b, const struct frame *f, const struct checked *c, int *status)
{
    const unsigned char *body = f->body;
    if (!b->entry[E_cuLaunchKernel] || !c->function || !c->stream)
        return LEFT;
    size_t n = c->var_len[0];
    void *extra[] = {(void *)1, b->params, (void *)2, &n, (void *)0};
    if (n)
        memcpy(b->params, c->var[0], n);
    *status = ((launch_fn)b->entry[E_cuLaunchKernel])(
        VALUE(c->function), FIELD(body, launch_req, grid_x), FIELD(body, launch_req, grid_y),
        FIELD(body, launch_req, grid_z), FIELD(body, launch_req, block_x),
        FIELD(body, launch_req, block_y), FIELD(body, launch_req, block_z),
        FIELD(body, launch_req, shared_mem), VALUE(c->stream), NULL, n ? extra : NULL);
    return DONE;
}

static int launch_ex(struct burst *b, const struct frame *f, const struct checked *c,
                     int *status)
{
    const unsigned char *body = f->body;
    if (!b->entry[E_cuLaunchKernelEx] || !c->function || !c->stream)
        return LEFT;
    size_t n = c->var_len[0];
    uint32_t m = c->var_len[1];
    void *extra[] = {(void *)1, b->params, (void *)2, &n, (void *)0};
    if (n)
        memcpy(b->params, c->var[0], n);
    if (m)
        memcpy(b->attrs, c->var[1], m);
    struct launch_config config = {
        {FIELD(body, launch_ex_req, grid_x), FIELD(body, launch_ex_req, grid_y),
         FIELD(body, launch_ex_req, grid_z)},
        {FIELD(body, launch_ex_req, block_x), FIELD(body, launch_ex_req, block_y),
         FIELD(body, launch_ex_req, block_z)},
        FIELD(body, launch_ex_req, shared_mem), VALUE(c->stream), b->attrs,
        m / HVGPU_LAUNCH_ATTR_SIZE};
    *status = ((launch_ex_fn)b->entry[E_cuLaunchKernelEx])(&config, VALUE(c->function), NULL,
                                                            n ? extra : NULL);
    return DONE;
}

static int event_record(struct burst *b, const struct checked *c, int *status)
{
    if (!b->entry[E_cuEventRecord] || !c->event || !c->stream)
        return LEFT;
    *status = ((event_record_fn)b->entry[E_cuEventRecord])(VALUE(c->event), VALUE(c->stream));
    return DONE;
}

static int stream_wait_event(struct burst *b, const struct frame *f, const struct checked *c,
                             int *status)
{
    if (!b->entry[E_cuStreamWaitEvent] || !c->stream || !c->event)
        return LEFT;
    *status = ((stream_wait_event_fn)b->entry[E_cuStreamWaitEvent])(
        VALUE(c->stream), VALUE(c->event), FIELD(f->body, hvgpu_stream_wait_event_req_t, flags));
    return DONE;
}

static int memset_(struct burst *b, const struct frame *f, const struct checked *c, int *status)
{
    typedef hvgpu_memset_req_t req;
    const unsigned char *body = f->body;
    uint64_t dst = FIELD(body, req, dst), count = FIELD(body, req, count);
    uint32_t value = FIELD(body, req, value), width = FIELD(body, req, width);
    /* The entry point by width (which its field check has found to be 1, 2 or 4). */
    int entry = width == 1 ? E_cuMemsetD8Async : width == 2 ? E_cuMemsetD16Async :
                width == 4 ? E_cuMemsetD32Async : -1;
    void *fn = entry < 0 ? NULL : b->entry[entry];
    if (!fn || !c->stream)
        return LEFT;
    if (width == 1)
        *status = ((memset_d8_fn)fn)(dst, (unsigned char)value, count, VALUE(c->stream));
    else if (width == 2)
        *status = ((memset_d16_fn)fn)(dst, (unsigned short)value, count, VALUE(c->stream));
    else
        *status = ((memset_d32_fn)fn)(dst, value, count, VALUE(c->stream));
    return DONE;
}

static int memcpy_dtod(struct burst *b, const struct frame *f, const struct checked *c,
                       int *status)
{
    typedef hvgpu_memcpy_dtod_req_t req;
    if (!b->entry[E_cuMemcpyDtoDAsync] || !c->stream)
        return LEFT;
    *status = ((memcpy_dtod_fn)b->entry[E_cuMemcpyDtoDAsync])(
        FIELD(f->body, req, dst), FIELD(f->body, req, src), FIELD(f->body, req, size),
        VALUE(c->stream));
    return DONE;
}

static int memcpy_htod(struct burst *b, const struct frame *f, const struct checked *c,
                       int *status, struct hv_burst_result *out)
{
    typedef hvgpu_memcpy_htod_req_t req;
    uint64_t n = f->payload_len;
    if (!b->ring || !c->stream)
        return LEFT;
    uint64_t dst = FIELD(f->body, req, dst), handle = FIELD(f->body, req, stream);
    struct ring *r = b->ring;
    if (b->held >= 0 && (b->held_stream != handle || b->held_used + n > r->segment)) {
        /* One event per segment covers one stream's copies only. */
        int failed = ring_release(b);
        if (failed) { /* stopping before this frame; the copies that record was for own it */
            out->status = failed;
            out->seq = b->held_seq;
            out->op = HVGPU_OP_MEMCPY_HTOD;
            return LEFT;
        }
    }
    if (b->held < 0) {
        b->held = ring_take(b);
        if (b->held < 0)
            return LEFT;
        b->held_stream = handle;
        b->held_value = c->stream->value;
    }
    unsigned char *at = r->base + (uint64_t)b->held * r->segment + b->held_used;
    memcpy(at, f->body + f->body_len, n);
    *status = ((memcpy_htod_fn)b->entry[E_cuMemcpyHtoDAsync])(dst, at, n, VALUE(c->stream));
    if (!*status) {
        b->held_used += n;
        b->held_seq = f->seq;
        out->h2d_bytes += n;
    }
    return DONE;
}

HV_EXPORT void hv_burst_run(struct burst *b, const unsigned char *buf, uint64_t len,
                            uint32_t version, uint32_t max_body, struct hv_burst_result *out)
{
    uint64_t at = 0;
    memset(out, 0, sizeof *out);
    while (len - at >= HVGPU_HEADER_SIZE) {
        const unsigned char *h = buf + at;
        uint16_t op = FIELD(h, hvgpu_header_t, op);
        int index = served_index(op);
        struct frame f = {h + HVGPU_HEADER_SIZE, FIELD(h, hvgpu_header_t, body_len),
                          FIELD(h, hvgpu_header_t, payload_len), FIELD(h, hvgpu_header_t, seq)};
        if (FIELD(h, hvgpu_header_t, magic) != HVGPU_MAGIC ||
            FIELD(h, hvgpu_header_t, version) != version ||
            FIELD(h, hvgpu_header_t, flags) != HVGPU_FLAG_ONEWAY || index < 0 ||
            f.body_len > max_body)
            break;
        if (f.payload_len && !hv_served[index].payload)
            break; /* its op takes none */
        if (op == HVGPU_OP_MEMCPY_HTOD) {
            /* Small copies only: their bytes are staged in one ring segment. */
            if (!f.payload_len || (b->ring && f.payload_len > b->ring->segment))
                break;
            if (!b->ring) {
                out->want_ring = !b->no_ring && b->entry[E_cuMemcpyHtoDAsync] &&
                                 b->entry[E_cuEventRecord] && b->entry[E_cuEventSynchronize];
                break;
            }
        }
        uint64_t size = HVGPU_HEADER_SIZE + f.body_len + f.payload_len;
        if (len - at < size) {
            out->need = (uint32_t)size; /* below 2^32: body and payload are bounded above */
            break;
        }
        int status = 0, done;
        struct checked c = {0};
        if (check_frame(b, index, &f, &c) != DONE)
            break;
        switch (index) {
        case S_LAUNCH_KERNEL: done = launch(b, &f, &c, &status); break;
        case S_LAUNCH_KERNEL_EX: done = launch_ex(b, &f, &c, &status); break;
        case S_EVENT_RECORD: done = event_record(b, &c, &status); break;
        case S_STREAM_WAIT_EVENT: done = stream_wait_event(b, &f, &c, &status); break;
        case S_MEMSET: done = memset_(b, &f, &c, &status); break;
        case S_MEMCPY_DTOD: done = memcpy_dtod(b, &f, &c, &status); break;
        case S_MEMCPY_HTOD: done = memcpy_htod(b, &f, &c, &status, out); break;
        default: done = LEFT; break; /* a served op without a driver call here */
        }
        if (done != DONE)
            break;
        at += size;
        out->served[index]++;
        if (status) {
            out->status = status;
            out->seq = f.seq;
            out->op = op;
            break;
        }
    }
    /* The segment goes back with its event recorded: between runs the session may
       destroy the stream its copies are on. */
    if (b->held >= 0) {
        uint32_t seq = b->held_seq;
        int failed = ring_release(b);
        if (failed && !out->status) {
            out->status = failed;
            out->seq = seq;
            out->op = HVGPU_OP_MEMCPY_HTOD;
        }
    }
    out->consumed = at;
}
