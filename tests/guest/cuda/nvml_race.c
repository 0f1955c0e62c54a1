/* Many threads learn vGPU 0 at once while others already read its name with a
   2-byte buffer: copy_text's two strlen()s see different names. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <time.h>
typedef struct nvml_dev *nvmlDevice_t;
int nvmlInit_v2(void);
int nvmlDeviceGetHandleByIndex_v2(unsigned, nvmlDevice_t *);
int nvmlDeviceGetName(nvmlDevice_t, char *, unsigned);
#define THREADS 24
static pthread_barrier_t go;
static volatile int overflow;
static void *worker(void *arg) {
    nvmlDevice_t h;
    pthread_barrier_wait(&go);
    /* thread 0 learns first (the host holds its UUID reply); the others start their
       learn() while it waits, and write the name after it has finished */
    if (arg) { struct timespec d = {0, 100 * 1000 * 1000}; nanosleep(&d, NULL); }
    if (nvmlDeviceGetHandleByIndex_v2(0, &h)) return NULL;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        static __thread char buf[160];
        for (int k = 0; k < 1000 && !overflow; k++) {
            buf[2] = 0x55;
            nvmlDeviceGetName(h, buf, 2);
            if (buf[2] != 0x55) overflow = 2;
        }
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while (!overflow && t.tv_sec - t0.tv_sec < 3);
    return NULL;
}
int main(void) {
    if (nvmlInit_v2()) { puts("init failed"); return 2; }
    pthread_t th[THREADS];
    pthread_barrier_init(&go, NULL, THREADS);
    for (int i = 0; i < THREADS; i++) pthread_create(&th[i], NULL, worker, (void *)(long)i);
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
    if (overflow) { printf("OVERFLOW: nvmlDeviceGetName(h, buf, 2) wrote buf[%d]\n", overflow); return 3; }
    puts("no overflow seen");
    return 0;
}
