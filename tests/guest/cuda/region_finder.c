/* A test double for the shim's finder of the VM's region device (region.c):
 * preloaded, it maps the file $HVGPU_TEST_REGION as a guest maps the ivshmem BAR,
 * and answers only where the header the executor wrote there carries the token
 * and vGPU asked for (hvgpu/virtio/region.py's HEADER). It counts its calls in
 * $HVGPU_TEST_REGION_CALLS (one line each) so a test sees that it was asked.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct __attribute__((packed)) header {
    char magic[8];
    uint32_t version, data_offset;
    uint64_t size;
    uint8_t token[16];
    uint32_t device;
};

static char why[256];

const char *hvgpu_region_error(void) { return why; }

int hvgpu_region_find(const uint8_t token[16], uint32_t device, void **base, uint64_t *size) {
    const char *calls = getenv("HVGPU_TEST_REGION_CALLS");
    if (calls) {
        FILE *f = fopen(calls, "a");
        if (f) { fprintf(f, "device %u\n", device); fclose(f); }
    }
    const char *path = getenv("HVGPU_TEST_REGION");
    int fd = path ? open(path, O_RDWR | O_CLOEXEC) : -1;
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        snprintf(why, sizeof why, "test finder: no region file");
        if (fd >= 0) close(fd);
        return -2;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return -12;
    struct header h;
    memcpy(&h, p, sizeof h);
    if (memcmp(h.magic, "HVGPUSHM", 8) || h.version != 1 || h.data_offset != 4096 ||
        memcmp(h.token, token, 16) || h.device != device) {
        munmap(p, (size_t)st.st_size);
        snprintf(why, sizeof why, "test finder: the region's header carries another token");
        return -2;
    }
    *base = p;
    *size = (uint64_t)st.st_size;
    return 0;
}
