/* Large memory copies on several threads: what the region lane uses to move a
 * staged chunk between the program's pageable memory and a slot of the region.
 *
 * One thread's memcpy moves 8-10 GB/s on the GPU machine, less than the driver's
 * own pageable copies reach (up to 15 GB/s for a 1 GiB device-to-host copy), and
 * the region's DMA is several times faster still; splitting each chunk among a few
 * threads removes the guest's copy as the limit. The helpers are started on the
 * first large copy, wait on a condition variable in between, block every signal
 * (the program's handlers run on its own threads) and are forgotten in a fork's
 * child, which starts them again when it needs them. One copy uses the helpers at a
 * time; a copy that finds them busy runs on its caller's thread alone.
 *
 * HVGPU_COPY_THREADS sets how many threads share a copy (default: the online CPUs,
 * at most 4; 1 turns the helpers off).
 *
 * Must not touch anything but the two ranges it is given.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shim.h"

/* Its numbers (HVGPU_PARALLEL_COPY_*) are hvgpu/virtio/tuning.py's, for the shim and
   the Python API (which calls this library) alike. */

static pthread_mutex_t busy = PTHREAD_MUTEX_INITIALIZER; /* one copy on the helpers */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t go = PTHREAD_COND_INITIALIZER, done = PTHREAD_COND_INITIALIZER;
static int threads = -1;      /* threads per copy, caller included; -1 not decided yet */
static int helpers;           /* helpers running */
static unsigned long job;     /* bumped per copy */
static int pending;           /* helpers yet to finish this job */
static char *job_dst;
static const char *job_src;
static size_t job_part, job_n;
/* The job each helper started after: a helper started late (in a forked child, or
   after a failed pthread_create) must not take the last job done for a new one. */
static unsigned long born[HVGPU_PARALLEL_COPY_MAX_THREADS];

static void part(int i, char *dst, const char *src, size_t n, size_t each) {
    size_t off = (size_t)i * each;
    if (off >= n) return;
    memcpy(dst + off, src + off, n - off < each ? n - off : each);
}

static void *helper(void *arg) {
    int me = (int)(intptr_t)arg;
    pthread_mutex_lock(&lock);
    unsigned long seen = born[me];
    for (;;) {
        while (job == seen) pthread_cond_wait(&go, &lock);
        seen = job;
        char *dst = job_dst;
        const char *src = job_src;
        size_t n = job_n, each = job_part;
        pthread_mutex_unlock(&lock);
        part(me, dst, src, n, each);
        pthread_mutex_lock(&lock);
        if (--pending == 0) pthread_cond_signal(&done);
    }
    return NULL;
}

static void in_child(void) {
    /* the helpers did not come along; a lock they held stays held in the copy */
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t c = PTHREAD_COND_INITIALIZER;
    busy = m;
    lock = m;
    go = c;
    done = c;
    helpers = 0;
    pending = 0;
}

static int decide_threads(void) {
    const char *e = getenv(HVGPU_ENV_COPY_THREADS);
    long want = HVGPU_PARALLEL_COPY_THREADS;
    if (e && *e) {
        char *end;
        long v = strtol(e, &end, 10);
        if (*end == '\0' && v >= 1) want = v;
    } else {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        if (cpus >= 1 && cpus < want) want = cpus;
    }
    if (want > HVGPU_PARALLEL_COPY_MAX_THREADS) want = HVGPU_PARALLEL_COPY_MAX_THREADS;
    pthread_atfork(NULL, NULL, in_child);
    return (int)want;
}

/* Starts the helpers still missing; called with busy held. */
static void start_helpers(void) {
    if (helpers >= threads - 1) return;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    while (helpers < threads - 1) {
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        born[helpers + 1] = job; /* busy is held: no job starts meanwhile */
        int ok = pthread_create(&t, &a, helper, (void *)(intptr_t)(helpers + 1)) == 0;
        pthread_attr_destroy(&a);
        if (!ok) break;
        helpers++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

void hv_copy(void *dst, const void *src, size_t n) {
    if (n < HVGPU_PARALLEL_COPY_MIN || __atomic_load_n(&threads, __ATOMIC_ACQUIRE) == 1 ||
        pthread_mutex_trylock(&busy) != 0) {
        memcpy(dst, src, n);
        return;
    }
    if (threads < 0) __atomic_store_n(&threads, decide_threads(), __ATOMIC_RELEASE);
    start_helpers();
    if (helpers == 0) {
        pthread_mutex_unlock(&busy);
        memcpy(dst, src, n);
        return;
    }
    int parts = helpers + 1;
    /* Every byte has a part: the share is rounded up before it is aligned, or a share
       that n / parts already aligns would leave the n % parts last bytes to nobody. */
    size_t share = n / parts + (n % parts != 0);
    size_t each = (share + HVGPU_PARALLEL_COPY_ALIGN - 1) & ~(HVGPU_PARALLEL_COPY_ALIGN - 1);
    pthread_mutex_lock(&lock);
    job_dst = dst;
    job_src = src;
    job_n = n;
    job_part = each;
    pending = helpers;
    job++;
    pthread_cond_broadcast(&go);
    pthread_mutex_unlock(&lock);
    part(0, dst, src, n, each);
    pthread_mutex_lock(&lock);
    while (pending > 0) pthread_cond_wait(&done, &lock);
    pthread_mutex_unlock(&lock);
    pthread_mutex_unlock(&busy);
}
