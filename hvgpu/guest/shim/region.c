/* The VM's region device, found and mapped (for the shim and the Python API).
 *
 * An ivshmem-plain device (PCI 1af4:1110) needs no kernel driver: its memory is
 * BAR 2, mapped from sysfs (/sys/bus/pci/devices/ADDR/resource2). The executor
 * writes a header at the region's start (hvgpu/virtio/region.py) and hands the
 * guest its token in REGION_ATTACH's reply; hvgpu_region_find maps each ivshmem
 * device in turn and keeps the one whose header carries that token and vGPU.
 *
 * The header's layout and numbers are hvgpu/virtio/region.py's, generated into
 * hvgpu_wire.h (hvgpu_region_header_t, HVGPU_REGION_*); tests/guest/
 * test_shim_region.py finds headers that module packs.
 * The sysfs root is $HVGPU_SYSFS_ROOT or /sys. This file must not talk to the
 * agent, and must not trust the header for more than picking the device.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shim.h"

#define STR_(x) #x
#define STR(x) STR_(x)
#define RESOURCE "resource" STR(HVGPU_REGION_PCI_BAR) /* the memory BAR's file in sysfs */

static __thread char last_error[1024];

HV_EXPORT const char *hvgpu_region_error(void) { return last_error; }

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap); /* a long path is cut, not overrun */
    va_end(ap);
}

/* dir/name into out; 0 when it does not fit (no such file can be opened then). */
static int join(char *out, size_t cap, const char *dir, const char *name) {
    int n = snprintf(out, cap, "%s/%s", dir, name);
    return n > 0 && (size_t)n < cap;
}

/* A sysfs attribute written as hex (vendor, device); 0 when it cannot be read. */
static unsigned long read_hex(const char *dir, const char *name) {
    char path[4096], text[32] = {0};
    if (!join(path, sizeof path, dir, name)) return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    return n > 0 ? strtoul(text, NULL, 16) : 0;
}

/* Maps one device's BAR 2: 0, or -errno with last_error saying why. */
static int map_resource(const char *dir, const char *address, void **base, uint64_t *size) {
    char path[4096];
    if (!join(path, sizeof path, dir, RESOURCE)) return -ENAMETOOLONG;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        int err = errno;
        if (err == EACCES || err == EPERM)
            say("the VM's region device %s is there, but this user (uid %u) may "
                "not open %s for reading and writing: as root, run `hvgpu-guest install` "
                "(the udev rule /etc/udev/rules.d/70-hvgpu-region.rules gives group hvgpu "
                "read and write on it) and add this user to group hvgpu",
                address, (unsigned)geteuid(), path);
        else
            say("cannot open %s: %s", path, strerror(err));
        return -err;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < (off_t)HVGPU_REGION_DATA_OFFSET) {
        say("%s is too small for an hvgpu region", path);
        close(fd);
        return -EINVAL;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd); /* the mapping stays */
    if (p == MAP_FAILED) {
        say("cannot map %s: %s", path, strerror(err));
        return -err;
    }
    *base = p;
    *size = (uint64_t)st.st_size;
    return 0;
}

static int carries(const void *base, const uint8_t token[HVGPU_REGION_TOKEN_SIZE],
                   uint32_t device) {
    hvgpu_region_header_t h;
    memcpy(&h, base, sizeof h);
    return memcmp(h.magic, HVGPU_REGION_MAGIC, sizeof h.magic) == 0 &&
           h.version == HVGPU_REGION_VERSION && h.data_offset == HVGPU_REGION_DATA_OFFSET &&
           memcmp(h.token, token, sizeof h.token) == 0 && h.device == device;
}

/* 0 with *base and *size set to the mapped region whose header carries token for vGPU
   device; -ENOENT where no device carries it; else the first failure to map one (a
   device this user may not open: -EACCES), with hvgpu_region_error() saying which. */
HV_EXPORT int hvgpu_region_find(const uint8_t token[HVGPU_REGION_TOKEN_SIZE], uint32_t device,
                                void **base, uint64_t *size) {
    if (!token || !base || !size) return -EINVAL;
    const char *root = getenv(HVGPU_ENV_SYSFS_ROOT);
    char devices[4096];
    if (!join(devices, sizeof devices, root && *root ? root : "/sys", "bus/pci/devices"))
        return -ENAMETOOLONG;
    last_error[0] = 0;
    DIR *d = opendir(devices);
    if (!d) {
        say("no PCI devices in %s", devices);
        return -ENOENT;
    }
    int failure = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char dir[4096], probe[4096];
        if (!join(dir, sizeof dir, devices, e->d_name)) continue;
        if (read_hex(dir, "vendor") != HVGPU_REGION_PCI_VENDOR ||
            read_hex(dir, "device") != HVGPU_REGION_PCI_DEVICE)
            continue;
        if (!join(probe, sizeof probe, dir, RESOURCE) || access(probe, F_OK) != 0)
            continue; /* no memory BAR: not ivshmem-plain */
        void *p = NULL;
        uint64_t n = 0;
        char keep[sizeof last_error];
        memcpy(keep, last_error, sizeof keep); /* the first failure is the one reported */
        int rc = map_resource(dir, e->d_name, &p, &n);
        if (rc != 0) {
            if (!failure) failure = rc;
            else memcpy(last_error, keep, sizeof keep);
            continue;
        }
        if (carries(p, token, device)) {
            closedir(d);
            *base = p;
            *size = n;
            last_error[0] = 0;
            return 0;
        }
        munmap(p, (size_t)n);
    }
    closedir(d);
    if (failure) return failure;
    say("no region device in %s carries this region's token", devices);
    return -ENOENT;
}
