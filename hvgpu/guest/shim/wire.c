/* The shim's connections to the hvgpu agent, one per vGPU, and the frames on them.
 *
 * Owns the sockets: connects to $HVGPU_AGENT (default: the host over vsock;
 * vGPU N at the port + N, or the Nth of a comma-separated list), does the
 * HELLO handshake, sends synchronous calls and pipelined one-way frames
 * (coalesced into one buffer per connection until a call needs an answer), and
 * reads replies. A call goes to the vGPU of the calling thread's current
 * context unless hv_route() names another. It knows frames, not CUDA: it must
 * not interpret op bodies. Writes use MSG_NOSIGNAL so a vanished agent is an
 * error, never SIGPIPE.
 *
 * A silent agent is an error, never a hang: connecting, and every wait for the
 * agent to send or to take bytes, gives up after $HVGPU_TIMEOUT seconds
 * (default 60, at least 2, 0: never) with CUDA_ERROR_DEVICE_UNAVAILABLE. The
 * kernel keeps that clock (SO_RCVTIMEO/SO_SNDTIMEO); the agent's progress
 * frames (we announce HVGPU_CAP_PROGRESS), sent while it works on something
 * long, restart it.
 *
 * HVGPU_SHIM_STATS=1 counts the frames sent, per op, synchronous calls (each a
 * round trip) apart from one-way frames, and prints them on stderr at exit.
 *
 * The region lane (region_lane.c) holds one connection's lock across a whole
 * copy (hv_wire_hold): it sends several synchronous requests before reading
 * their replies, which come in order, and passes a memfd with a frame
 * (SCM_RIGHTS on its first byte) where the connection is a unix socket.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "shim.h"

#ifndef AF_VSOCK
#define AF_VSOCK 40
#endif
struct hv_sockaddr_vm { /* linux/vm_sockets.h, kept local so headers are not needed */
    unsigned short svm_family;
    unsigned short svm_reserved1;
    unsigned int svm_port;
    unsigned int svm_cid;
    unsigned char svm_zero[4];
};

enum { ST_NEW, ST_READY, ST_FAILED, ST_LOST };

struct wire {
    pthread_mutex_t lock;
    int state;
    CUresult error;          /* what every call returns once FAILED or LOST */
    int fd;
    uint32_t seq;
    unsigned char *batch;
    size_t batch_len;
    unsigned failures;       /* errors of one-way frames the agent has reported */
    uint64_t caps;           /* what HELLO agreed on */
    int passes_fds;          /* a unix socket to the agent itself: descriptors can travel */
    char address[512];
    /* A standalone wire (hvgpu_client_open, the Python API's): its own timeout, the
       agent's statuses unmapped, and nothing said on stderr (the caller raises). */
    int standalone;
    double timeout;          /* seconds; 0: none */
    void *lane;              /* region_lane.c's state of its region lane */
    int refused;             /* the first refusal since the exported call began: */
    int refused_status;
    uint16_t refused_op;
    uint32_t refused_seq;
    int refused_earlier;     /* ... an earlier one-way frame's */
    char *refused_message;
    uint32_t refused_len;
    char lost_why[1024];     /* why the connection was lost, in a sentence */
    void *body_heap;         /* the last reply's body or payload beyond the caller's buffer */
    void *payload_heap;
};

static struct wire wires[HV_MAX_DEVICES] = {
    [0 ... HV_MAX_DEVICES - 1] = { .lock = PTHREAD_MUTEX_INITIALIZER, .state = ST_NEW, .fd = -1 }
};
static int trace_level = -1;
static double timeout_s = -1; /* $HVGPU_TIMEOUT once read; 0: no timeout */
static __thread int routed = -1; /* the device hv_route() named, or -1 */

/* $HVGPU_SHIM_STATS: frames sent per op code, all vGPUs together; codes past the
   table's range share the last slot. */
#define STATS_OPS 256
static int stats_level = -1;
static uint64_t stats_sync[STATS_OPS], stats_oneway[STATS_OPS];
/* Counted always, for hvgpu_shim_round_trips(): one relaxed add is nothing beside a
   round trip. */
static uint64_t round_trips;

static int stats_enabled(void) {
    int level = __atomic_load_n(&stats_level, __ATOMIC_RELAXED);
    if (level < 0) {
        const char *t = getenv("HVGPU_SHIM_STATS");
        level = t && *t && strcmp(t, "0") ? 1 : 0;
        __atomic_store_n(&stats_level, level, __ATOMIC_RELAXED);
    }
    return level;
}

int hv_stats_enabled(void) { return stats_enabled(); }

/* Counted always (printed only under HVGPU_SHIM_STATS): one relaxed add is nothing
   beside a send, and hvgpu_shim_frames answers from them. */
static void count_frame(uint16_t op, int oneway) {
    if (!oneway) __atomic_add_fetch(&round_trips, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&(oneway ? stats_oneway : stats_sync)[op < STATS_OPS ? op : STATS_OPS - 1],
                       1, __ATOMIC_RELAXED);
}

/* Frames of op this process has sent so far, all connections together: synchronous
   requests and one-way frames (what a test or a benchmark checks took a path). */
HV_EXPORT void hvgpu_shim_frames(uint16_t op, uint64_t *sync, uint64_t *oneway) {
    int at = op < STATS_OPS ? op : STATS_OPS - 1;
    *sync = __atomic_load_n(&stats_sync[at], __ATOMIC_RELAXED);
    *oneway = __atomic_load_n(&stats_oneway[at], __ATOMIC_RELAXED);
}

/* Synchronous round trips this process has made to the agent so far, all vGPUs
   together: a benchmark or test reads it around a step (the program itself is in
   the same process, so it finds the symbol with dlsym). */
HV_EXPORT uint64_t hvgpu_shim_round_trips(void) {
    return __atomic_load_n(&round_trips, __ATOMIC_RELAXED);
}

/* One table on stderr, written at once: the ops with the most round trips first. */
static void print_stats(void) {
    uint64_t sync[STATS_OPS], oneway[STATS_OPS], total_sync = 0, total_oneway = 0;
    int order[STATS_OPS], n = 0;
    for (int op = 0; op < STATS_OPS; op++) {
        sync[op] = __atomic_load_n(&stats_sync[op], __ATOMIC_RELAXED);
        oneway[op] = __atomic_load_n(&stats_oneway[op], __ATOMIC_RELAXED);
        if (!sync[op] && !oneway[op]) continue;
        int at = n++;
        while (at > 0 && (sync[order[at - 1]] < sync[op] ||
                          (sync[order[at - 1]] == sync[op] && oneway[order[at - 1]] < oneway[op]))) {
            order[at] = order[at - 1];
            at--;
        }
        order[at] = op;
        total_sync += sync[op];
        total_oneway += oneway[op];
    }
    if (!n) return;
    char text[(STATS_OPS + 3) * 80];
    size_t len = 0;
    len += (size_t)snprintf(text + len, sizeof text - len,
                            "hvgpu: frames sent to the agent (HVGPU_SHIM_STATS), pid %d\n"
                            "hvgpu:   %-28s %12s %12s\n", (int)getpid(), "op", "sync", "one-way");
    for (int i = 0; i < n && len < sizeof text; i++) {
        const char *name = order[i] < STATS_OPS - 1 ? hvgpu_op_name((uint16_t)order[i])
                                                    : "ops 0xff and up";
        char unnamed[16];
        if (!name) {
            snprintf(unnamed, sizeof unnamed, "op 0x%02x", order[i]);
            name = unnamed;
        }
        len += (size_t)snprintf(text + len, sizeof text - len, "hvgpu:   %-28s %12llu %12llu\n",
                                name, (unsigned long long)sync[order[i]],
                                (unsigned long long)oneway[order[i]]);
    }
    if (len < sizeof text)
        len += (size_t)snprintf(text + len, sizeof text - len, "hvgpu:   %-28s %12llu %12llu\n",
                                "total", (unsigned long long)total_sync,
                                (unsigned long long)total_oneway);
    if (len > sizeof text) len = sizeof text;
    ssize_t ignored = write(2, text, len);
    (void)ignored;
}

int hv_route(int device) {
    int previous = routed;
    routed = device;
    return previous;
}

int hv_routed_device(void) {
    if (routed >= 0) return routed;
    struct hv_ctx *c = hv_current();
    return c && c->device >= 0 && c->device < HV_MAX_DEVICES ? c->device : 0;
}

static struct wire *target(void) { return &wires[hv_routed_device()]; }

/* A reply's body or payload longer than the caller's buffer: a standalone wire's
   exported calls keep it whole on the heap (until the next call), the shim's are cut. */
struct grow {
    uint32_t body_len;       /* the whole body's length */
    uint64_t payload_len;    /* the whole payload's */
};

int hv_trace_enabled(void) {
    if (trace_level < 0) {
        const char *t = getenv("HVGPU_SHIM_TRACE");
        trace_level = t && *t && strcmp(t, "0") ? (atoi(t) > 1 ? atoi(t) : 1) : 0; /* 2: lookups too */
    }
    return trace_level;
}

void hv_log(const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n > sizeof line - 2) n = sizeof line - 2;
    line[n] = '\n';
    ssize_t ignored = write(2, "hvgpu: ", 7);
    ignored = write(2, line, (size_t)n + 1);
    (void)ignored;
}

/* vGPU N: the Nth address of $HVGPU_AGENT, or its only (non-unix) one at port + N,
   or the host seen from a VM at the protocol table's port + N. */
static const char *address_of(struct wire *w) {
    if (w->address[0]) return w->address;
    const char *env = getenv(HVGPU_ENV_AGENT);
    int d = (int)(w - wires);
    if (!env || !*env) {
        snprintf(w->address, sizeof w->address, "vsock://%d:%d", HVGPU_HOST_CID,
                 HVGPU_DEFAULT_PORT + d);
        return w->address;
    }
    const char *item = env;
    for (int i = 0; i < d && item; i++) {
        item = strchr(item, ',');
        if (item) item++;
    }
    while (item && *item == ' ') item++;
    if (item && *item) {
        snprintf(w->address, sizeof w->address, "%.*s", (int)strcspn(item, ", "), item);
    } else if (!strchr(env, ',') && strncmp(env, "unix://", 7)) {
        const char *colon = strrchr(env, ':');
        long port = colon ? strtol(colon + 1, NULL, 10) : 0;
        snprintf(w->address, sizeof w->address, "%.*s:%ld", (int)(colon ? colon - env : 0), env,
                 port + d);
    } else {
        snprintf(w->address, sizeof w->address, "(HVGPU_AGENT lists no address for device %d)",
                 d);
    }
    return w->address;
}

const char *hv_agent_address(void) { return address_of(&wires[0]); }

static double timeout_seconds(void);
static double wire_timeout(const struct wire *w);

static double timeout_seconds(void) {
    if (timeout_s < 0) {
        const char *t = getenv(HVGPU_ENV_TIMEOUT);
        char *end = NULL;
        double v = t && *t ? strtod(t, &end) : HVGPU_DEFAULT_TIMEOUT;
        if (t && *t && (end == t || *end || !(v >= 0) || v > 1e9)) {
            hv_log(HVGPU_ENV_TIMEOUT "=%s is not a number of seconds; using %g", t,
                   HVGPU_DEFAULT_TIMEOUT);
            v = HVGPU_DEFAULT_TIMEOUT;
        }
        timeout_s = v > 0 && v < HVGPU_MIN_TIMEOUT ? HVGPU_MIN_TIMEOUT : v;
    }
    return timeout_s;
}

static double wire_timeout(const struct wire *w) {
    return w->standalone ? w->timeout : timeout_seconds();
}

/* Blocking calls on fd give up (EAGAIN) after t seconds without progress (0: never). */
static void set_timeouts(int fd, double t) {
    struct timeval tv = { (time_t)t, (suseconds_t)((t - (double)(time_t)t) * 1e6) };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

static int new_socket(int domain, int type, double t) {
    int fd = socket(domain, type | SOCK_CLOEXEC, 0);
    if (fd >= 0) set_timeouts(fd, t); /* connect() waits no longer either */
    return fd;
}

static int timed_out(int e) { return e == EAGAIN || e == EWOULDBLOCK || e == EINPROGRESS || e == ETIMEDOUT; }

/* Take the progress frames that have arrived, without waiting: how many. Anything
   else stays unread for the reply that is awaited. */
static int drain_progress(int fd) {
    int n = 0;
    hvgpu_header_t h;
    while (recv(fd, &h, sizeof h, MSG_PEEK | MSG_DONTWAIT) == (ssize_t)sizeof h &&
           h.magic == HVGPU_MAGIC && (h.flags & HVGPU_FLAG_PROGRESS) && !h.body_len &&
           !h.payload_len) {
        if (recv(fd, &h, sizeof h, MSG_DONTWAIT) != (ssize_t)sizeof h) break;
        n++;
    }
    return n;
}

/* Past `sent` bytes of the n-entry iovec array (*iov): the entries sent go, the one
   cut is shortened. */
static void advance(struct iovec **iov, int *n, size_t sent) {
    while (*n > 0 && sent >= (*iov)->iov_len) {
        sent -= (*iov)->iov_len;
        (*iov)++;
        (*n)--;
    }
    if (*n > 0) {
        (*iov)->iov_base = (char *)(*iov)->iov_base + sent;
        (*iov)->iov_len -= sent;
    }
}

static int send_all(int fd, struct iovec *iov, int n) {
    while (n > 0) {
        struct msghdr m = {0};
        m.msg_iov = iov;
        m.msg_iovlen = (size_t)n;
        ssize_t sent = sendmsg(fd, &m, MSG_NOSIGNAL);
        if (sent < 0) {
            if (errno == EINTR) continue;
            if ((errno == EAGAIN || errno == EWOULDBLOCK) && drain_progress(fd) > 0)
                continue; /* the agent is busy, not gone: it still takes nothing, so wait on */
            return -1;
        }
        advance(&iov, &n, (size_t)sent);
    }
    return 0;
}

/* As send_all, with descriptor `pass` riding on the first byte (SCM_RIGHTS). */
static int send_all_passing(int fd, struct iovec *iov, int n, int pass) {
    if (pass < 0) return send_all(fd, iov, n);
    union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } control;
    memset(&control, 0, sizeof control);
    struct msghdr m = {0};
    m.msg_iov = iov;
    m.msg_iovlen = (size_t)n;
    m.msg_control = control.buf;
    m.msg_controllen = sizeof control.buf;
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &pass, sizeof pass);
    ssize_t sent;
    do {
        sent = sendmsg(fd, &m, MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    if (sent <= 0) {
        if (sent == 0) errno = EPIPE;
        return -1;
    }
    advance(&iov, &n, (size_t)sent);
    return send_all(fd, iov, n); /* the rest goes as usual */
}

static int recv_all(int fd, void *buf, size_t n) {
    char *p = buf;
    while (n) {
        ssize_t got = recv(fd, p, n, 0);
        if (got == 0) { errno = ECONNRESET; return -1; }
        if (got < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += got;
        n -= (size_t)got;
    }
    return 0;
}

static int discard(int fd, uint64_t n) {
    char sink[4096];
    while (n) {
        size_t k = n < sizeof sink ? (size_t)n : sizeof sink;
        if (recv_all(fd, sink, k) < 0) return -1;
        n -= k;
    }
    return 0;
}

/* What the GPU's kernels printed (device printf), which the executor sends before the
   reply of the call whose synchronisation flushed it: onto this process's stdout, through
   stdio as the driver's own output would go, so it keeps its place among the program's
   lines, and flushed, as the call has not returned yet. */
static int kernel_output(int fd, uint64_t n) {
    char buf[1 << 16];
    while (n) {
        size_t k = n < sizeof buf ? (size_t)n : sizeof buf;
        if (recv_all(fd, buf, k) < 0) return -1;
        size_t wrote = fwrite(buf, 1, k, stdout); /* short only if stdout is closed */
        (void)wrote;
        n -= k;
    }
    fflush(stdout);
    return 0;
}

/* The connection is gone: every later call fails the same clear way. */
static CUresult lost(struct wire *w, const char *what) {
    int e = errno;
    if (w->state != ST_LOST && timed_out(e)) {
        snprintf(w->lost_why, sizeof w->lost_why, "the hvgpu agent at %s did not answer for "
                 "%g s (HVGPU_TIMEOUT) while %s; the connection is closed", address_of(w),
                 wire_timeout(w), what);
    } else if (w->state != ST_LOST) {
        snprintf(w->lost_why, sizeof w->lost_why, "lost the connection to the hvgpu agent at "
                 "%s (%s while %s: %s); the GPU work of this connection is gone",
                 address_of(w), e == EPROTO ? "broke the protocol" : "went away", what,
                 e == EPROTO ? "not the reply awaited" : strerror(e));
    }
    if (w->standalone) {
        /* the caller raises lost_why */
    } else if (w->state != ST_LOST && timed_out(e)) {
        hv_log("the hvgpu agent at %s did not answer for %g s (HVGPU_TIMEOUT) while %s; "
               "the connection is closed, GPU work of this process is gone, calls now fail "
               "with CUDA_ERROR_DEVICE_UNAVAILABLE", address_of(w), timeout_seconds(), what);
    } else if (w->state != ST_LOST) {
        hv_log("lost the connection to the hvgpu agent at %s (%s: %s); GPU work of this "
               "process is gone, calls now fail with CUDA_ERROR_DEVICE_UNAVAILABLE",
               address_of(w), what, strerror(e));
    }
    if (w->state != ST_LOST) {
        if (w->fd >= 0) close(w->fd);
        w->fd = -1;
        w->state = ST_LOST;
        w->error = CUDA_ERROR_DEVICE_UNAVAILABLE;
    }
    return w->error;
}

static int connect_unix(const char *path, double t) {
    struct sockaddr_un a = {0};
    if (strlen(path) >= sizeof a.sun_path) { errno = ENAMETOOLONG; return -1; }
    a.sun_family = AF_UNIX;
    strcpy(a.sun_path, path);
    int fd = new_socket(AF_UNIX, SOCK_STREAM, t);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        int e = errno; close(fd); errno = e; return -1;
    }
    return fd;
}

/* Parses the forms hvgpu.virtio.address documents and connects. */
static int open_socket(const char *addr, char *why, size_t whylen, double t) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", addr);
    if (!strncmp(buf, "unix://", 7)) {
        return connect_unix(buf + 7, t);
    }
    if (!strncmp(buf, "hvsock://", 9)) {
        char *colon = strrchr(buf + 9, ':');
        if (!colon) { snprintf(why, whylen, "hvsock address needs :PORT"); errno = EINVAL; return -1; }
        *colon = 0;
        int fd = connect_unix(buf + 9, t);
        if (fd < 0) return -1;
        char line[64];
        int n = snprintf(line, sizeof line, "CONNECT %s\n", colon + 1);
        struct iovec iov = { line, (size_t)n };
        char c; size_t i = 0; char reply[64];
        if (send_all(fd, &iov, 1) < 0) { close(fd); return -1; }
        int got = 0;
        while (i < sizeof reply - 1 && (got = recv_all(fd, &c, 1)) == 0 && c != '\n') reply[i++] = c;
        reply[i] = 0;
        if (got < 0 && timed_out(errno)) { close(fd); errno = ETIMEDOUT; return -1; } /* silent */
        if (strncmp(reply, "OK", 2) != 0) {
            snprintf(why, whylen, "the VMM refused CONNECT %s: %s", colon + 1, reply);
            close(fd); errno = ECONNREFUSED; return -1;
        }
        return fd;
    }
    if (!strncmp(buf, "vsock://", 8)) {
        char *colon = strrchr(buf + 8, ':');
        if (!colon) { snprintf(why, whylen, "vsock address needs :PORT"); errno = EINVAL; return -1; }
        *colon = 0;
        struct hv_sockaddr_vm a = {0};
        a.svm_family = AF_VSOCK;
        a.svm_cid = !strcmp(buf + 8, "host") ? HVGPU_HOST_CID : (unsigned)strtoul(buf + 8, NULL, 10);
        a.svm_port = (unsigned)strtoul(colon + 1, NULL, 10);
        int fd = new_socket(AF_VSOCK, SOCK_STREAM, t);
        if (fd < 0) return -1;
        if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
            int e = errno; close(fd); errno = e; return -1;
        }
        return fd;
    }
    if (!strncmp(buf, "tcp://", 6)) {
        char *host = buf + 6, *colon = strrchr(host, ':');
        if (!colon) { snprintf(why, whylen, "tcp address needs :PORT"); errno = EINVAL; return -1; }
        *colon = 0;
        if (*host == '[') { host++; char *e = strchr(host, ']'); if (e) *e = 0; }
        struct addrinfo hints = {0}, *res;
        hints.ai_socktype = SOCK_STREAM;
        int rc = getaddrinfo(host, colon + 1, &hints, &res);
        if (rc) { snprintf(why, whylen, "%s", gai_strerror(rc)); errno = EINVAL; return -1; }
        int fd = -1;
        for (struct addrinfo *r = res; r; r = r->ai_next) {
            fd = new_socket(r->ai_family, r->ai_socktype, t);
            if (fd >= 0 && connect(fd, r->ai_addr, r->ai_addrlen) == 0) break;
            if (fd >= 0) close(fd);
            fd = -1;
        }
        freeaddrinfo(res);
        return fd;
    }
    snprintf(why, whylen, "not an address hvgpu knows (use vsock://CID:PORT, unix:///path, "
             "hvsock:///path:PORT or tcp://HOST:PORT)");
    errno = EINVAL;
    return -1;
}

static void pack_header(hvgpu_header_t *h, uint16_t op, uint8_t flags, uint32_t seq,
                        uint32_t body_len, uint64_t payload_len) {
    memset(h, 0, sizeof *h);
    h->magic = HVGPU_MAGIC;
    h->version = HVGPU_PROTOCOL_VERSION;
    h->flags = flags;
    h->op = op;
    h->seq = seq;
    h->body_len = body_len;
    h->payload_len = payload_len;
}

static CUresult flush_locked(struct wire *w) {
    if (!w->batch_len) return CUDA_SUCCESS;
    struct iovec iov = { w->batch, w->batch_len };
    w->batch_len = 0;
    if (send_all(w->fd, &iov, 1) < 0) return lost(w, "sending");
    return CUDA_SUCCESS;
}

/* Agent-side statuses become the CUDA error a program can act on. */
static CUresult to_cuda(int status, const char *message) {
    if (status < HVGPU_STATUS_OWN_BASE) return status;
    hv_log("the hvgpu agent refused a call: %s", message);
    switch (status) {
    case HVGPU_STATUS_HVGPU_ERROR_NO_GPU:
    case HVGPU_STATUS_HVGPU_ERROR_NO_SLICE:
        return CUDA_ERROR_NO_DEVICE;
    case HVGPU_STATUS_HVGPU_ERROR_UNKNOWN_OP:
        return CUDA_ERROR_NOT_SUPPORTED;
    case HVGPU_STATUS_HVGPU_ERROR_OVERSIZE:
        return CUDA_ERROR_INVALID_VALUE;
    default:
        return CUDA_ERROR_UNKNOWN;
    }
}

/* What a refusal returns: the agent's own status on a standalone wire (its caller
   reads the rest with hvgpu_client_refusal), the CUDA error for the shim. */
static CUresult refusal(struct wire *w, int status, uint16_t op, uint32_t seq, int earlier,
                        const char *message, uint32_t len) {
    if (!w->standalone) return to_cuda(status, message);
    if (!w->refused) { /* the first one is what the call reports */
        char *m = realloc(w->refused_message, (size_t)len + 1);
        if (m) {
            memcpy(m, message, len);
            m[len] = 0;
            w->refused_message = m;
        }
        w->refused_len = m ? len : 0;
        w->refused = 1;
        w->refused_status = status;
        w->refused_op = op;
        w->refused_seq = seq;
        w->refused_earlier = earlier;
    }
    return status;
}

/* A synchronous request, sent without waiting for its reply (read_reply_locked reads
   it; replies come in the order of their requests); `pass` >= 0: a descriptor rides
   on the frame's first byte. */
static CUresult send_request_locked(struct wire *w, uint16_t op, const void *body,
                                    uint32_t body_len, const void *payload,
                                    uint64_t payload_len, int pass, uint32_t *seq_out) {
    if (w->state != ST_READY) return w->error;
    CUresult r = flush_locked(w);
    if (r) return r;
    hvgpu_header_t h;
    uint32_t seq = ++w->seq;
    pack_header(&h, op, 0, seq, body_len, payload_len);
    count_frame(op, 0);
    struct iovec iov[3] = { { &h, sizeof h }, { (void *)body, body_len },
                            { (void *)payload, (size_t)payload_len } };
    if (send_all_passing(w->fd, iov, 3, pass) < 0) return lost(w, "sending");
    *seq_out = seq;
    return CUDA_SUCCESS;
}

/* g: a standalone wire's exported call, which keeps a body or payload beyond the
   caller's buffers whole (body_heap, payload_heap) and learns their lengths. */
static CUresult read_reply_grow(struct wire *w, uint16_t op, uint32_t seq, void *reply,
                                uint32_t reply_cap, uint32_t *reply_len, void *rpayload,
                                uint64_t rpayload_len, struct grow *g) {
    if (w->state != ST_READY) return w->error;
    hvgpu_header_t h;
    for (;;) {
        if (recv_all(w->fd, &h, sizeof h) < 0) return lost(w, "waiting for a reply");
        if (h.magic == HVGPU_MAGIC && (h.flags & HVGPU_FLAG_OUTPUT) &&
            (h.flags & HVGPU_FLAG_REPLY) && !h.body_len) {
            if (kernel_output(w->fd, h.payload_len) < 0) return lost(w, "receiving kernel output");
            continue; /* what kernels printed; the reply follows */
        }
        if (h.magic != HVGPU_MAGIC || !(h.flags & HVGPU_FLAG_PROGRESS)) break;
        /* still working on it: the clock starts again */
        if (discard(w->fd, h.body_len) < 0 || discard(w->fd, h.payload_len) < 0)
            return lost(w, "waiting for a reply");
    }
    if (h.magic != HVGPU_MAGIC || !(h.flags & HVGPU_FLAG_REPLY) || h.seq != seq || h.op != op ||
        h.body_len > HVGPU_MAX_BODY) {
        errno = EPROTO;
        return lost(w, "reading a reply");
    }
    if (h.status != 0) {
        unsigned char small[1024 + sizeof(hvgpu_error_rep_t)];
        /* a standalone wire keeps the whole message (a compile log), the shim 1 KiB */
        uint32_t n = w->standalone || h.body_len < sizeof small ? h.body_len
                                                                 : (uint32_t)sizeof small;
        unsigned char *eb = n <= sizeof small ? small : malloc(n);
        if (!eb) {
            n = sizeof small;
            eb = small;
        }
        if (recv_all(w->fd, eb, n) < 0 || discard(w->fd, h.body_len - n) < 0 ||
            discard(w->fd, h.payload_len) < 0) {
            if (eb != small) free(eb);
            return lost(w, "reading an error");
        }
        int earlier = 0; /* the error of a one-way frame, kept for this call */
        uint16_t failed_op = op;
        uint32_t failed_seq = seq, len = 0;
        const char *msg = "";
        hvgpu_error_rep_view_t e;
        if (hvgpu_error_rep_decode(eb, n, &e) >= 0) { /* a long message is cut */
            msg = (const char *)e.message.data;
            len = e.message.len;
            failed_op = e.fixed.op;
            failed_seq = e.fixed.seq;
            earlier = e.fixed.seq != seq || e.fixed.op != op;
            if (earlier) __atomic_add_fetch(&w->failures, 1, __ATOMIC_RELEASE);
        }
        char text[1024];
        snprintf(text, sizeof text, "%.*s", (int)len, msg);
        if (hv_trace_enabled()) {
            const char *name = hvgpu_op_name(op);
            hv_log("%s%s failed with %d: %s", name ? name : "an op",
                   earlier ? " reported an earlier one-way frame that" : "", h.status, text);
        }
        CUresult r = refusal(w, h.status, failed_op, failed_seq, earlier,
                             w->standalone ? msg : text, w->standalone ? len : (uint32_t)strlen(text));
        if (eb != small) free(eb);
        return r;
    }
    uint32_t keep = h.body_len < reply_cap ? h.body_len : reply_cap;
    if (g) {
        g->body_len = h.body_len;
        g->payload_len = h.payload_len;
    }
    if (g && h.body_len > reply_cap) { /* whole, on the heap */
        void *big = realloc(w->body_heap, h.body_len);
        if (!big) {
            errno = ENOMEM;
            return lost(w, "reading a reply");
        }
        w->body_heap = big;
        if (recv_all(w->fd, big, h.body_len) < 0) return lost(w, "reading a reply");
        keep = h.body_len;
    } else if (recv_all(w->fd, reply, keep) < 0 || discard(w->fd, h.body_len - keep) < 0) {
        return lost(w, "reading a reply");
    }
    if (reply_len) *reply_len = keep;
    if (h.payload_len) {
        if (rpayload && h.payload_len <= rpayload_len) {
            if (recv_all(w->fd, rpayload, (size_t)h.payload_len) < 0) return lost(w, "receiving data");
        } else if (g && !rpayload && h.payload_len <= HVGPU_MAX_PAYLOAD) {
            void *big = realloc(w->payload_heap, (size_t)h.payload_len);
            if (!big) {
                errno = ENOMEM;
                return lost(w, "receiving data");
            }
            w->payload_heap = big;
            if (recv_all(w->fd, big, (size_t)h.payload_len) < 0) return lost(w, "receiving data");
        } else {
            if (discard(w->fd, h.payload_len) < 0) return lost(w, "receiving data");
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    return CUDA_SUCCESS;
}

static CUresult read_reply_locked(struct wire *w, uint16_t op, uint32_t seq, void *reply,
                                  uint32_t reply_cap, uint32_t *reply_len, void *rpayload,
                                  uint64_t rpayload_len) {
    return read_reply_grow(w, op, seq, reply, reply_cap, reply_len, rpayload, rpayload_len, NULL);
}

static CUresult call_locked(struct wire *w, uint16_t op, const void *body, uint32_t body_len, const void *payload,
                            uint64_t payload_len, void *reply, uint32_t reply_cap,
                            uint32_t *reply_len, void *rpayload, uint64_t rpayload_len) {
    uint32_t seq;
    CUresult r = send_request_locked(w, op, body, body_len, payload, payload_len, -1, &seq);
    return r ? r : read_reply_locked(w, op, seq, reply, reply_cap, reply_len, rpayload,
                                     rpayload_len);
}

static void child_after_fork(void) {
    /* The parent's connections (and their GPU objects) stay the parent's. */
    for (int d = 0; d < HV_MAX_DEVICES; d++) {
        struct wire *w = &wires[d];
        pthread_mutex_init(&w->lock, NULL);
        if (w->fd >= 0) close(w->fd);
        w->fd = -1;
        w->batch_len = 0;
        w->state = ST_NEW;
    }
    memset(stats_sync, 0, sizeof stats_sync); /* the child counts its own frames */
    memset(stats_oneway, 0, sizeof stats_oneway);
    round_trips = 0;
}

static void flush_at_exit(void) {
    for (int d = 0; d < HV_MAX_DEVICES; d++) {
        struct wire *w = &wires[d];
        if (pthread_mutex_trylock(&w->lock) == 0) {
            if (w->state == ST_READY) flush_locked(w);
            pthread_mutex_unlock(&w->lock);
        }
    }
}

static CUresult handshake_locked(struct wire *w) {
    char why[256] = "";
    const char *addr = address_of(w);
    w->fd = open_socket(addr, why, sizeof why, timeout_seconds());
    if (w->fd < 0 && !why[0] && timed_out(errno)) {
        hv_log("the hvgpu agent at %s did not accept a connection within %g s (HVGPU_TIMEOUT); "
               "calls fail with CUDA_ERROR_DEVICE_UNAVAILABLE", addr, timeout_seconds());
        return CUDA_ERROR_DEVICE_UNAVAILABLE;
    }
    if (w->fd < 0) {
        hv_log("cannot reach the hvgpu agent at %s: %s; is a GPU slice attached to this VM "
               "(hvgpu attach on the host)? Set HVGPU_AGENT to use another address",
               addr, why[0] ? why : strerror(errno));
        return CUDA_ERROR_NO_DEVICE;
    }
    /* Who speaks, and for which process of the VM (the VM's processes on the vGPU are
       listed by these): protocol.py's client_text. */
    char argv0[HVGPU_MAX_PROCESS_NAME + 1] = "";
    FILE *f = fopen("/proc/self/cmdline", "re");
    if (f) {
        size_t got = fread(argv0, 1, sizeof argv0 - 1, f);
        argv0[got] = 0;
        fclose(f);
    }
    char client[64 + sizeof argv0];
    int clen = snprintf(client, sizeof client, HVGPU_CLIENT_FORMAT, hv_client_software,
                        (int)getpid(), argv0[0] ? argv0 : "?");
    if (clen < 0) clen = 0;
    if ((size_t)clen >= sizeof client) clen = (int)sizeof client - 1;
    unsigned char body[sizeof(hvgpu_hello_req_t) + sizeof client];
    hvgpu_hello_req_t req = { HVGPU_PROTOCOL_VERSION, HVGPU_PROTOCOL_MIN_VERSION, hv_client_caps,
                              (uint32_t)clen };
    memcpy(body, &req, sizeof req);
    memcpy(body + sizeof req, client, (size_t)clen);
    unsigned char rep[512];
    uint32_t n = 0;
    w->state = ST_READY; /* call_locked needs it; undone below on failure */
    CUresult r = call_locked(w, HVGPU_OP_HELLO, body, (uint32_t)(sizeof req + (size_t)clen),
                             NULL, 0, rep, sizeof rep, &n, NULL, 0);
    if (r != CUDA_SUCCESS) {
        if (w->state == ST_READY) {
            hv_log("the hvgpu agent at %s refused the handshake (%d)", addr, r);
            close(w->fd);
            w->fd = -1;
        }
        return r == CUDA_ERROR_DEVICE_UNAVAILABLE ? CUDA_ERROR_NO_DEVICE : r;
    }
    hvgpu_hello_rep_view_t hello;
    hvgpu_hello_rep_decode(rep, n, &hello); /* too short: no capabilities */
    w->caps = hello.fixed.caps;
    /* Only a socket straight to the agent carries descriptors (hvsock goes through the
       VMM, which forwards bytes alone). */
    w->passes_fds = !strncmp(addr, "unix://", 7);
    if (hv_trace_enabled()) hv_log("connected to %s", addr);
    return CUDA_SUCCESS;
}

CUresult hv_ensure(void) {
    static int atfork_done;
    struct wire *w = target();
    if (__atomic_load_n(&w->state, __ATOMIC_ACQUIRE) == ST_READY) return CUDA_SUCCESS;
    pthread_mutex_lock(&w->lock);
    CUresult r;
    if (w->state == ST_NEW) {
        if (!__atomic_exchange_n(&atfork_done, 1, __ATOMIC_ACQ_REL)) {
            pthread_atfork(NULL, NULL, child_after_fork);
            if (stats_enabled()) atexit(print_stats); /* runs after the flush below */
            atexit(flush_at_exit);
        }
        if (!w->batch) w->batch = malloc(HVGPU_BATCH_BYTES);
        r = w->batch ? handshake_locked(w) : CUDA_ERROR_OUT_OF_MEMORY;
        if (r == CUDA_SUCCESS) {
            __atomic_store_n(&w->state, ST_READY, __ATOMIC_RELEASE);
        } else if (w->state != ST_LOST) {
            w->state = ST_FAILED;
            w->error = r;
        }
    }
    r = w->state == ST_READY ? CUDA_SUCCESS : w->error;
    pthread_mutex_unlock(&w->lock);
    return r;
}

CUresult hv_call(uint16_t op, const void *body, uint32_t body_len, const void *payload,
                 uint64_t payload_len, void *reply, uint32_t reply_cap, uint32_t *reply_len,
                 void *rpayload, uint64_t rpayload_len) {
    CUresult r = hv_ensure();
    if (r) return r;
    struct wire *w = target();
    pthread_mutex_lock(&w->lock);
    r = w->state == ST_READY ? call_locked(w, op, body, body_len, payload, payload_len, reply,
                                          reply_cap, reply_len, rpayload, rpayload_len)
                            : w->error;
    pthread_mutex_unlock(&w->lock);
    return r;
}

static CUresult oneway_locked(struct wire *w, uint16_t op, const void *body, uint32_t body_len,
                              const void *payload, uint64_t payload_len) {
    if (w->state != ST_READY) return w->error;
    CUresult r = CUDA_SUCCESS;
    hvgpu_header_t h;
    pack_header(&h, op, HVGPU_FLAG_ONEWAY, ++w->seq, body_len, payload_len);
    count_frame(op, 1);
    uint64_t total = sizeof h + body_len + payload_len;
    if (w->batch_len + total > HVGPU_BATCH_BYTES && (r = flush_locked(w)) != CUDA_SUCCESS) return r;
    if (total <= HVGPU_BATCH_BYTES) {
        unsigned char *p = w->batch + w->batch_len;
        memcpy(p, &h, sizeof h);
        memcpy(p + sizeof h, body, body_len);
        if (payload_len) memcpy(p + sizeof h + body_len, payload, (size_t)payload_len);
        w->batch_len += (size_t)total;
    } else { /* bulk data goes straight from the program's memory */
        struct iovec iov[3] = { { &h, sizeof h }, { (void *)body, body_len },
                                { (void *)payload, (size_t)payload_len } };
        if (send_all(w->fd, iov, 3) < 0) r = lost(w, "sending");
    }
    return r;
}

CUresult hv_oneway(uint16_t op, const void *body, uint32_t body_len, const void *payload,
                   uint64_t payload_len) {
    CUresult r = hv_ensure();
    if (r) return r;
    struct wire *w = target();
    pthread_mutex_lock(&w->lock);
    r = oneway_locked(w, op, body, body_len, payload, payload_len);
    pthread_mutex_unlock(&w->lock);
    return r;
}

unsigned hv_oneway_failures(void) {
    return __atomic_load_n(&target()->failures, __ATOMIC_ACQUIRE);
}

CUresult hv_flush(void) {
    CUresult r = hv_ensure();
    if (r) return r;
    struct wire *w = target();
    pthread_mutex_lock(&w->lock);
    r = w->state == ST_READY ? flush_locked(w) : w->error;
    pthread_mutex_unlock(&w->lock);
    return r;
}

/* -- one connection held across several frames (region_lane.c) ------------------- */

struct wire *hv_wire_hold(CUresult *r) {
    *r = hv_ensure();
    if (*r) return NULL;
    struct wire *w = target();
    pthread_mutex_lock(&w->lock);
    if (w->state != ST_READY) {
        *r = w->error;
        pthread_mutex_unlock(&w->lock);
        return NULL;
    }
    return w;
}

void hv_wire_release(struct wire *w) { pthread_mutex_unlock(&w->lock); }

int hv_wire_device(const struct wire *w) { return w->standalone ? -1 : (int)(w - wires); }

int hv_wire_standalone(const struct wire *w) { return w->standalone; }

void **hv_wire_lane(struct wire *w) { return &w->lane; }

CUresult hv_wire_take(struct wire *w) {
    pthread_mutex_lock(&w->lock);
    w->refused = 0; /* an exported call begins: its first refusal is what it reports */
    if (w->state == ST_READY) return CUDA_SUCCESS;
    pthread_mutex_unlock(&w->lock);
    return w->error;
}

uint64_t hv_wire_caps(const struct wire *w) { return w->state == ST_READY ? w->caps : 0; }

int hv_wire_passes_fds(const struct wire *w) { return w->passes_fds; }

unsigned hv_wire_failures(const struct wire *w) {
    return __atomic_load_n(&w->failures, __ATOMIC_ACQUIRE);
}

CUresult hv_wire_oneway(struct wire *w, uint16_t op, const void *body, uint32_t body_len) {
    return oneway_locked(w, op, body, body_len, NULL, 0);
}

CUresult hv_wire_oneway_payload(struct wire *w, uint16_t op, const void *body, uint32_t body_len,
                                const void *payload, uint64_t payload_len) {
    return oneway_locked(w, op, body, body_len, payload, payload_len);
}

CUresult hv_wire_call_payload(struct wire *w, uint16_t op, const void *body, uint32_t body_len,
                              void *rpayload, uint64_t rpayload_len) {
    return call_locked(w, op, body, body_len, NULL, 0, NULL, 0, NULL, rpayload, rpayload_len);
}

CUresult hv_wire_send(struct wire *w, uint16_t op, const void *body, uint32_t body_len,
                      int pass, uint32_t *seq) {
    return send_request_locked(w, op, body, body_len, NULL, 0, pass, seq);
}

CUresult hv_wire_reply(struct wire *w, uint16_t op, uint32_t seq, void *reply,
                       uint32_t reply_cap, uint32_t *reply_len) {
    return read_reply_locked(w, op, seq, reply, reply_cap, reply_len, NULL, 0);
}

CUresult hv_wire_call(struct wire *w, uint16_t op, const void *body, uint32_t body_len,
                      int pass, void *reply, uint32_t reply_cap, uint32_t *reply_len) {
    uint32_t seq;
    CUresult r = send_request_locked(w, op, body, body_len, NULL, 0, pass, &seq);
    return r ? r : read_reply_locked(w, op, seq, reply, reply_cap, reply_len, NULL, 0);
}

CUresult hv_wire_flush(struct wire *w) {
    return w->state == ST_READY ? flush_locked(w) : w->error;
}

CUresult hv_unsupported(const char *api, int *once) {
    if (!__atomic_exchange_n(once, 1, __ATOMIC_RELAXED))
        hv_log("%s is not implemented by the hvgpu shim; it returns CUDA_ERROR_NOT_SUPPORTED "
               "(hvgpu-guest coverage lists what is)", api);
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* -- standalone connections: the Python API's (hvgpu/guest/client.py) ------------
 *
 * A wire of its own, to an address the caller names, with its own timeout, HELLO's
 * client text and capabilities. Each call below takes the wire's lock for itself;
 * a caller that pairs hvgpu_client_send with hvgpu_client_reply keeps other threads
 * out between them. Each returns 0 or a status: where hvgpu_client_lost says a
 * sentence, the connection is gone (and every later call fails so); else where
 * hvgpu_client_refusal has one, the agent refused (its status, raw, as it sent it);
 * else the status is this library's own (CUDA_ERROR_INVALID_VALUE: a reply payload
 * larger than the buffer given for it). Nothing is said on stderr.
 */

HV_EXPORT void hvgpu_client_close(struct wire *w);

/* hvgpu_client_open's *status where it returns NULL: 0 the address cannot be reached,
   HVGPU_CLIENT_TIMED_OUT it did not accept within the timeout, HVGPU_CLIENT_LOST the
   connection broke during HELLO, else the agent's refusal of HELLO (why: its message). */
#define HVGPU_CLIENT_TIMED_OUT (-2)
#define HVGPU_CLIENT_LOST (-1)

static void begin(struct wire *w) {
    w->refused = 0;
}

HV_EXPORT struct wire *hvgpu_client_open(const char *address, double timeout_s, uint64_t caps,
                                         const char *client, uint32_t client_len, void *hello,
                                         uint32_t hello_cap, uint32_t *hello_len, int *status,
                                         char *why, uint32_t whylen) {
    *status = 0;
    why[0] = 0;
    struct wire *w = calloc(1, sizeof *w);
    unsigned char *batch = malloc(HVGPU_BATCH_BYTES);
    if (!w || !batch) {
        free(w);
        free(batch);
        *status = CUDA_ERROR_OUT_OF_MEMORY;
        snprintf(why, whylen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&w->lock, NULL);
    w->batch = batch;
    w->standalone = 1;
    w->timeout = timeout_s > 0 ? timeout_s : 0;
    w->state = ST_NEW;
    w->error = CUDA_ERROR_DEVICE_UNAVAILABLE;
    snprintf(w->address, sizeof w->address, "%s", address);
    char said[256] = "";
    errno = 0;
    w->fd = open_socket(address, said, sizeof said, w->timeout);
    if (w->fd < 0) {
        int e = errno;
        if (!said[0] && timed_out(e)) {
            *status = HVGPU_CLIENT_TIMED_OUT;
            snprintf(why, whylen, "the hvgpu agent at %s did not accept a connection within "
                     "%g s (HVGPU_TIMEOUT)", address, w->timeout);
        } else { /* status stays 0: unreachable */
            snprintf(why, whylen, "cannot connect to %s: %s%s", address,
                     said[0] ? said : strerror(e),
                     e == ECONNREFUSED || e == ENOENT || e == ECONNRESET
                         ? ": is the hvgpu agent running and listening there?" : "");
        }
        hvgpu_client_close(w);
        return NULL;
    }
    w->passes_fds = !strncmp(address, "unix://", 7);
    w->state = ST_READY;
    if (client_len > HVGPU_MAX_BODY - sizeof(hvgpu_hello_req_t)) client_len = 0;
    unsigned char *body = malloc(sizeof(hvgpu_hello_req_t) + client_len);
    if (!body) {
        *status = CUDA_ERROR_OUT_OF_MEMORY;
        snprintf(why, whylen, "out of memory");
        hvgpu_client_close(w);
        return NULL;
    }
    hvgpu_hello_req_t req = { HVGPU_PROTOCOL_VERSION, HVGPU_PROTOCOL_MIN_VERSION, caps, client_len };
    memcpy(body, &req, sizeof req);
    memcpy(body + sizeof req, client, client_len);
    begin(w);
    CUresult r = call_locked(w, HVGPU_OP_HELLO, body, (uint32_t)(sizeof req + client_len), NULL, 0,
                             hello, hello_cap, hello_len, NULL, 0);
    free(body);
    if (r) {
        *status = w->state == ST_LOST ? HVGPU_CLIENT_LOST : r;
        if (w->state == ST_LOST)
            snprintf(why, whylen, "%s", w->lost_why);
        else
            snprintf(why, whylen, "%.*s", (int)w->refused_len,
                     w->refused_message ? w->refused_message : "");
        hvgpu_client_close(w);
        return NULL;
    }
    hvgpu_hello_rep_view_t v;
    hvgpu_hello_rep_decode(hello, *hello_len, &v); /* too short: no capabilities */
    w->caps = v.fixed.caps;
    return w;
}

/* A synchronous call (pass >= 0: a descriptor travels with it). The reply's body goes
   to reply (reply_cap bytes; *reply_len its whole length, and hvgpu_client_reply_body
   holds it all where it is longer); its payload to rpayload (rpayload_cap bytes), or,
   where rpayload is NULL, to hvgpu_client_reply_payload (*rpayload_len its length). */
HV_EXPORT int hvgpu_client_call(struct wire *w, uint16_t op, const void *body, uint32_t body_len,
                                const void *payload, uint64_t payload_len, int pass, void *reply,
                                uint32_t reply_cap, uint32_t *reply_len, void *rpayload,
                                uint64_t rpayload_cap, uint64_t *rpayload_len) {
    pthread_mutex_lock(&w->lock);
    begin(w);
    uint32_t seq;
    struct grow g = { 0, 0 };
    CUresult r = send_request_locked(w, op, body, body_len, payload, payload_len, pass, &seq);
    if (!r) r = read_reply_grow(w, op, seq, reply, reply_cap, NULL, rpayload, rpayload_cap, &g);
    *reply_len = g.body_len;
    *rpayload_len = g.payload_len;
    pthread_mutex_unlock(&w->lock);
    return r;
}

/* A synchronous request sent without waiting; its seq for hvgpu_client_reply. */
HV_EXPORT int hvgpu_client_send(struct wire *w, uint16_t op, const void *body, uint32_t body_len,
                                int pass, uint32_t *seq) {
    pthread_mutex_lock(&w->lock);
    begin(w);
    CUresult r = send_request_locked(w, op, body, body_len, NULL, 0, pass, seq);
    pthread_mutex_unlock(&w->lock);
    return r;
}

/* The reply to seq (replies come in the order of their requests); a payload goes to
   hvgpu_client_reply_payload. */
HV_EXPORT int hvgpu_client_reply(struct wire *w, uint16_t op, uint32_t seq, void *reply,
                                 uint32_t reply_cap, uint32_t *reply_len, uint64_t *rpayload_len) {
    pthread_mutex_lock(&w->lock);
    begin(w);
    struct grow g = { 0, 0 };
    CUresult r = read_reply_grow(w, op, seq, reply, reply_cap, NULL, NULL, 0, &g);
    *reply_len = g.body_len;
    *rpayload_len = g.payload_len;
    pthread_mutex_unlock(&w->lock);
    return r;
}

/* A one-way frame, coalesced with others until a call, hvgpu_client_flush or a full
   batch sends them; its error surfaces at a later call. */
HV_EXPORT int hvgpu_client_post(struct wire *w, uint16_t op, const void *body, uint32_t body_len,
                                const void *payload, uint64_t payload_len) {
    pthread_mutex_lock(&w->lock);
    begin(w);
    CUresult r = oneway_locked(w, op, body, body_len, payload, payload_len);
    pthread_mutex_unlock(&w->lock);
    return r;
}

HV_EXPORT int hvgpu_client_flush(struct wire *w) {
    pthread_mutex_lock(&w->lock);
    begin(w);
    CUresult r = w->state == ST_READY ? flush_locked(w) : w->error;
    pthread_mutex_unlock(&w->lock);
    return r;
}

/* Whether one-way frames wait in the batch. */
HV_EXPORT int hvgpu_client_pending(struct wire *w) {
    return __atomic_load_n(&w->batch_len, __ATOMIC_RELAXED) != 0;
}

/* Why the connection was lost, or "" while it is not. */
HV_EXPORT const char *hvgpu_client_lost(const struct wire *w) {
    return w->state == ST_LOST ? w->lost_why : "";
}

/* The refusal the last call met (the first, where several): 1 and its parts, else 0.
   earlier: it is an earlier one-way frame's error, surfaced at this call. */
HV_EXPORT int hvgpu_client_refusal(const struct wire *w, int *status, uint32_t *op,
                                   uint32_t *seq, int *earlier, const char **message,
                                   uint32_t *message_len) {
    if (!w->refused) return 0;
    *status = w->refused_status;
    *op = w->refused_op;
    *seq = w->refused_seq;
    *earlier = w->refused_earlier;
    *message = w->refused_message ? w->refused_message : "";
    *message_len = w->refused_len;
    return 1;
}

HV_EXPORT const void *hvgpu_client_reply_body(const struct wire *w) { return w->body_heap; }

HV_EXPORT const void *hvgpu_client_reply_payload(const struct wire *w) { return w->payload_heap; }

/* region_lane.c: lets go of a standalone wire's lane (weak: a library without the lane). */
void hv_lane_close(struct wire *w) __attribute__((weak));

/* Sends what is coalesced, closes the socket and frees the wire. */
HV_EXPORT void hvgpu_client_close(struct wire *w) {
    if (!w) return;
    pthread_mutex_lock(&w->lock);
    if (w->state == ST_READY) flush_locked(w); /* work already issued still reaches the GPU */
    if (w->lane && hv_lane_close) hv_lane_close(w);
    if (w->fd >= 0) close(w->fd);
    w->fd = -1;
    w->state = ST_LOST;
    pthread_mutex_unlock(&w->lock);
    pthread_mutex_destroy(&w->lock);
    free(w->batch);
    free(w->refused_message);
    free(w->body_heap);
    free(w->payload_heap);
    free(w);
}
