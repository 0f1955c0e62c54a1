/* The executor's hot loop for pipelined one-way frames.
 *
 * A training step is a stream of one-way frames (launches, event records,
 * stream waits, memsets, small copies); the session's Python loop costs more
 * per frame than the driver call itself. hv_burst_run walks such a run in the
 * session's receive buffer and makes the driver call of each frame through
 * the entry points it was given (libcuda's, or the test double's), checking
 * exactly what the Python path checks: the frame is a well-formed one-way
 * frame of this connection's version; its function, stream and event handles
 * belong to this guest; every device range it touches lies inside an
 * allocation (or module variable) of this guest; a parameter buffer has the
 * size the kernel takes; launch attributes are whole and name no event.
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
#include "launch_burst.h" /* the entry points, served ops and result, from launch_burst.py */

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
        ((event_synchronize_fn)b->entry[E_EVENT_SYNCHRONIZE])(
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
        status = ((event_record_fn)b->entry[E_EVENT_RECORD])(
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
    if (!ring || !b->entry[E_MEMCPY_HTOD] || !b->entry[E_EVENT_RECORD] ||
        !b->entry[E_EVENT_SYNCHRONIZE]) {
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

typedef hvgpu_launch_kernel_req_t launch_req;
typedef hvgpu_launch_kernel_ex_req_t launch_ex_req;

static int launch(struct burst *b, const struct frame *f, int *status)
{
    const unsigned char *body = f->body;
    if (!b->entry[E_LAUNCH] || f->body_len < sizeof(launch_req))
        return LEFT;
    uint32_t n = FIELD(body, launch_req, params_len);
    if ((uint64_t)sizeof(launch_req) + n != f->body_len || n > HVGPU_MAX_PARAMS)
        return LEFT;
    const struct slot *fn = find(&b->functions, FIELD(body, launch_req, function));
    const struct slot *stream = find(&b->streams, FIELD(body, launch_req, stream));
    if (!fn || !stream || fn->size != n)
        return LEFT;
    size_t size = n;
    void *extra[] = {(void *)1, b->params, (void *)2, &size, (void *)0};
    if (n)
        memcpy(b->params, body + sizeof(launch_req), n);
    *status = ((launch_fn)b->entry[E_LAUNCH])(
        VALUE(fn), FIELD(body, launch_req, grid_x), FIELD(body, launch_req, grid_y),
        FIELD(body, launch_req, grid_z), FIELD(body, launch_req, block_x),
        FIELD(body, launch_req, block_y), FIELD(body, launch_req, block_z),
        FIELD(body, launch_req, shared_mem), VALUE(stream), NULL, n ? extra : NULL);
    return DONE;
}

static int launch_ex(struct burst *b, const struct frame *f, int *status)
{
    const unsigned char *body = f->body;
    if (!b->entry[E_LAUNCH_EX] || f->body_len < sizeof(launch_ex_req))
        return LEFT;
    uint32_t n = FIELD(body, launch_ex_req, params_len), m = FIELD(body, launch_ex_req, attrs_len);
    if ((uint64_t)sizeof(launch_ex_req) + n + m != f->body_len || n > HVGPU_MAX_PARAMS ||
        m % HVGPU_LAUNCH_ATTR_SIZE || m / HVGPU_LAUNCH_ATTR_SIZE > HVGPU_MAX_LAUNCH_ATTRS)
        return LEFT;
    const unsigned char *attrs = body + sizeof(launch_ex_req) + n;
    for (uint32_t i = 0; i < m; i += HVGPU_LAUNCH_ATTR_SIZE) {
        uint32_t id = GET(uint32_t, attrs + i);
        if (id == HVGPU_LAUNCH_ATTR_PROGRAMMATIC_EVENT ||
            id == HVGPU_LAUNCH_ATTR_LAUNCH_COMPLETION_EVENT)
            return LEFT;
    }
    const struct slot *fn = find(&b->functions, FIELD(body, launch_ex_req, function));
    const struct slot *stream = find(&b->streams, FIELD(body, launch_ex_req, stream));
    if (!fn || !stream || fn->size != n)
        return LEFT;
    size_t size = n;
    void *extra[] = {(void *)1, b->params, (void *)2, &size, (void *)0};
    if (n)
        memcpy(b->params, body + sizeof(launch_ex_req), n);
    if (m)
        memcpy(b->attrs, attrs, m);
    struct launch_config config = {
        {FIELD(body, launch_ex_req, grid_x), FIELD(body, launch_ex_req, grid_y),
         FIELD(body, launch_ex_req, grid_z)},
        {FIELD(body, launch_ex_req, block_x), FIELD(body, launch_ex_req, block_y),
         FIELD(body, launch_ex_req, block_z)},
        FIELD(body, launch_ex_req, shared_mem), VALUE(stream), b->attrs,
        m / HVGPU_LAUNCH_ATTR_SIZE};
    *status = ((launch_ex_fn)b->entry[E_LAUNCH_EX])(&config, VALUE(fn), NULL,
                                                     n ? extra : NULL);
    return DONE;
}

static int event_record(struct burst *b, const struct frame *f, int *status)
{
    if (!b->entry[E_EVENT_RECORD] || f->body_len != sizeof(hvgpu_event_record_req_t))
        return LEFT;
    const struct slot *event = find(&b->events, FIELD(f->body, hvgpu_event_record_req_t, event));
    const struct slot *stream = find(&b->streams,
                                     FIELD(f->body, hvgpu_event_record_req_t, stream));
    if (!event || !stream)
        return LEFT;
    *status = ((event_record_fn)b->entry[E_EVENT_RECORD])(VALUE(event), VALUE(stream));
    return DONE;
}

static int stream_wait_event(struct burst *b, const struct frame *f, int *status)
{
    typedef hvgpu_stream_wait_event_req_t req;
    if (!b->entry[E_STREAM_WAIT_EVENT] || f->body_len != sizeof(req))
        return LEFT;
    const struct slot *stream = find(&b->streams, FIELD(f->body, req, stream));
    const struct slot *event = find(&b->events, FIELD(f->body, req, event));
    if (!stream || !event)
        return LEFT;
    *status = ((stream_wait_event_fn)b->entry[E_STREAM_WAIT_EVENT])(
        VALUE(stream), VALUE(event), FIELD(f->body, req, flags));
    return DONE;
}

static int memset_(struct burst *b, const struct frame *f, int *status)
{
    typedef hvgpu_memset_req_t req;
    const unsigned char *body = f->body;
    if (f->body_len != sizeof(req))
        return LEFT;
    uint64_t dst = FIELD(body, req, dst), count = FIELD(body, req, count);
    uint32_t value = FIELD(body, req, value), width = FIELD(body, req, width);
    int entry = width == 1 ? E_MEMSET_D8 : width == 2 ? E_MEMSET_D16 :
                width == 4 ? E_MEMSET_D32 : -1;
    if (entry < 0 || !b->entry[entry] || count > UINT64_MAX / width ||
        !inside(&b->ranges, dst, count * width))
        return LEFT;
    const struct slot *stream = find(&b->streams, FIELD(body, req, stream));
    if (!stream)
        return LEFT;
    void *fn = b->entry[entry];
    if (width == 1)
        *status = ((memset_d8_fn)fn)(dst, (unsigned char)value, count, VALUE(stream));
    else if (width == 2)
        *status = ((memset_d16_fn)fn)(dst, (unsigned short)value, count, VALUE(stream));
    else
        *status = ((memset_d32_fn)fn)(dst, value, count, VALUE(stream));
    return DONE;
}

static int memcpy_dtod(struct burst *b, const struct frame *f, int *status)
{
    typedef hvgpu_memcpy_dtod_req_t req;
    const unsigned char *body = f->body;
    if (!b->entry[E_MEMCPY_DTOD] || f->body_len != sizeof(req))
        return LEFT;
    uint64_t dst = FIELD(body, req, dst), src = FIELD(body, req, src);
    uint64_t size = FIELD(body, req, size);
    if (!inside(&b->ranges, dst, size) || !inside(&b->ranges, src, size))
        return LEFT;
    const struct slot *stream = find(&b->streams, FIELD(body, req, stream));
    if (!stream)
        return LEFT;
    *status = ((memcpy_dtod_fn)b->entry[E_MEMCPY_DTOD])(dst, src, size, VALUE(stream));
    return DONE;
}

static int memcpy_htod(struct burst *b, const struct frame *f, int *status,
                       struct hv_burst_result *out)
{
    typedef hvgpu_memcpy_htod_req_t req;
    uint64_t n = f->payload_len;
    if (f->body_len != sizeof(req) || !b->ring)
        return LEFT;
    uint64_t dst = FIELD(f->body, req, dst), handle = FIELD(f->body, req, stream);
    const struct slot *stream = find(&b->streams, handle);
    if (!inside(&b->ranges, dst, n) || !stream)
        return LEFT;
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
        b->held_value = stream->value;
    }
    unsigned char *at = r->base + (uint64_t)b->held * r->segment + b->held_used;
    memcpy(at, f->body + f->body_len, n);
    *status = ((memcpy_htod_fn)b->entry[E_MEMCPY_HTOD])(dst, at, n, VALUE(stream));
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
        if (op == HVGPU_OP_MEMCPY_HTOD) {
            /* Small copies only: their bytes are staged in one ring segment. */
            if (!f.payload_len || (b->ring && f.payload_len > b->ring->segment))
                break;
            if (!b->ring) {
                out->want_ring = !b->no_ring && b->entry[E_MEMCPY_HTOD] &&
                                 b->entry[E_EVENT_RECORD] && b->entry[E_EVENT_SYNCHRONIZE];
                break;
            }
        } else if (f.payload_len) {
            break;
        }
        uint64_t size = HVGPU_HEADER_SIZE + f.body_len + f.payload_len;
        if (len - at < size) {
            out->need = (uint32_t)size; /* below 2^32: body and payload are bounded above */
            break;
        }
        int status = 0, done;
        switch (index) {
        case S_LAUNCH_KERNEL: done = launch(b, &f, &status); break;
        case S_LAUNCH_KERNEL_EX: done = launch_ex(b, &f, &status); break;
        case S_EVENT_RECORD: done = event_record(b, &f, &status); break;
        case S_STREAM_WAIT_EVENT: done = stream_wait_event(b, &f, &status); break;
        case S_MEMSET: done = memset_(b, &f, &status); break;
        case S_MEMCPY_DTOD: done = memcpy_dtod(b, &f, &status); break;
        default: done = memcpy_htod(b, &f, &status, out); break;
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
