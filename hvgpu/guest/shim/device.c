/* Driver entry points for initialisation, devices and errors.
 *
 * cuInit connects once and caches what does not change (device count,
 * attributes, UUIDs). Contexts are context.c's. Must not forward anything it
 * can answer from the cache.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static CUresult init_result = CUDA_ERROR_NOT_INITIALIZED;
static int driver_version;

/* Features of the real GPU that the shim does not carry across: a program or library
   that asks must see the device without them, not try them and fail. Virtual memory
   management (102) and memory pools (115) are carried (vmm.c, pool.c), for device
   memory exportable as a POSIX file descriptor at most (103, served among the VM's
   processes by its executor, as IPC events are, 125), compressible or not (107 is the
   device's), pools too (MEMPOOL_SUPPORTED_HANDLE_TYPES, 119: the device's POSIX fd bit
   alone): the attributes of other handle types, RDMA and host memory pools stay 0.
   CAN_MAP_HOST_MEMORY (19) is the executor's answer (the device's, where the agent offers
   regions and the device reaches registered memory at its host address), and 1 here
   only where this process's lane can have a region (hv_region_can_map, which attaches
   nothing): pinned memory is then mapped at the program's addresses (region_lane.c),
   though an allocation whose address the executor cannot take, or made where the VM's
   region device turns out unusable, stays unmapped (cuMemHostGetDevicePointer says so).
   CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM (91) stays 0: registered memory is the
   program's own pages, which the executor cannot map. The stream memory operations'
   attributes (92-94 of the v1 API, 98 flushes, 122 64-bit, 123 NOR) are the device's:
   memops.c carries them to the driver's own entry points. */
static const int NOT_CARRIED[] = {
    86,  /* HOST_NATIVE_ATOMIC_SUPPORTED */
    88,  /* PAGEABLE_MEMORY_ACCESS */
    89,  /* CONCURRENT_MANAGED_ACCESS */
    91,  /* CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM */
    96,  /* COOPERATIVE_MULTI_DEVICE_LAUNCH (launches.c says why) */
    100, /* PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES */
    101, /* DIRECT_MANAGED_MEM_ACCESS_FROM_HOST */
    104, 105, /* HANDLE_TYPE_WIN32(_KMT)_HANDLE_SUPPORTED */
    110, /* GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED */
    112, /* SPARSE_CUDA_ARRAY_SUPPORTED (cuMemMapArrayAsync is not built) */
    116, /* GPU_DIRECT_RDMA_SUPPORTED */
    121, /* DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED */
    124, /* DMA_BUF_SUPPORTED */
    128, /* HANDLE_TYPE_FABRIC_SUPPORTED */
    132, /* MULTICAST_SUPPORTED */
    141, 142, 144, 145, /* HOST(_NUMA) memory pools and virtual memory management */
    147, /* ONLY_PARTIAL_HOST_NATIVE_ATOMIC_SUPPORTED */
};

static void initialise(void) {
    CUresult r = hv_ensure();
    if (r) { init_result = r; return; }
    hvgpu_driver_get_version_rep_t v;
    r = hv_call(HVGPU_OP_DRIVER_GET_VERSION, NULL, 0, NULL, 0, &v, sizeof v, NULL, NULL, 0);
    if (r) { init_result = r; return; }
    driver_version = v.version;
    hvgpu_device_get_count_rep_t c;
    r = hv_call(HVGPU_OP_DEVICE_GET_COUNT, NULL, 0, NULL, 0, &c, sizeof c, NULL, NULL, 0);
    if (r) { init_result = r; return; }
    /* One connection is one vGPU (hvgpu attach --count): device d's executor serves
     * it as its device 0, on connection d. */
    hv_device_count = c.count < HV_MAX_DEVICES ? c.count : HV_MAX_DEVICES;
    for (int d = 0; d < hv_device_count; d++) {
        hvgpu_device_get_attributes_req_t q = { 0, HV_ATTR_COUNT };
        unsigned char rep[sizeof(hvgpu_device_get_attributes_rep_t) + 4 * HV_ATTR_COUNT];
        uint32_t n = 0;
        r = HV_ON(d, hv_call(HVGPU_OP_DEVICE_GET_ATTRIBUTES, &q, sizeof q, NULL, 0, rep,
                             sizeof rep, &n, NULL, 0));
        if (r && d > 0) { /* the others still serve: the program gets the devices it can reach */
            hv_log("device %d of this VM's %d vGPUs cannot be reached (%d); the program sees "
                   "devices 0..%d", d, hv_device_count, r, d - 1);
            hv_device_count = d;
            break;
        }
        if (r) { init_result = r; return; }
        hvgpu_device_get_attributes_rep_view_t a; /* what there is of the values; 0: none */
        hvgpu_device_get_attributes_rep_decode(rep, n, &a);
        memcpy(&hv_attrs[d][1], a.values.data, a.values.len);
        for (size_t i = 0; i < sizeof NOT_CARRIED / sizeof *NOT_CARRIED; i++)
            hv_attrs[d][NOT_CARRIED[i]] = 0;
        hv_attrs[d][83] = 1; /* MANAGED_MEMORY: managed.c, without concurrent access (89) */
        hv_attrs[d][119] &= 1; /* MEMPOOL_SUPPORTED_HANDLE_TYPES: CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR */
        hvgpu_device_get_uuid_req_t u = { 0 };
        unsigned char urep[sizeof(hvgpu_device_get_uuid_rep_t) + HVGPU_UUID_SIZE];
        r = HV_ON(d, hv_call(HVGPU_OP_DEVICE_GET_UUID, &u, sizeof u, NULL, 0, urep, sizeof urep,
                             &n, NULL, 0));
        if (r) { init_result = r; return; }
        hvgpu_device_get_uuid_rep_view_t id; /* a short one is padded with zeros */
        hvgpu_device_get_uuid_rep_decode(urep, n, &id);
        memset(hv_uuids[d], 0, HVGPU_UUID_SIZE);
        memcpy(hv_uuids[d], id.uuid.data, id.uuid.len < HVGPU_UUID_SIZE ? id.uuid.len
                                                                        : HVGPU_UUID_SIZE);
    }
    init_result = hv_device_count ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

static CUresult ready(void) {
    pthread_once(&init_once, initialise);
    return init_result;
}

int hv_driver_version(void) {
    ready();
    return driver_version ? driver_version : HV_API_VERSION;
}

HV_EXPORT CUresult cuInit(unsigned int flags) {
    (void)flags;
    return ready();
}

HV_EXPORT CUresult cuDriverGetVersion(int *version) {
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    /* Without an agent the runtime must still get as far as cuInit, whose
       error says what is wrong, rather than blaming the driver's version. */
    *version = hv_driver_version();
    return CUDA_SUCCESS;
}

CUresult hv_check_device(CUdevice dev) {
    CUresult r = ready();
    if (r) return r;
    return dev >= 0 && dev < hv_device_count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

HV_EXPORT CUresult cuDeviceGetCount(int *count) {
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = ready();
    *count = r ? 0 : hv_device_count;
    return r;
}

HV_EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = hv_check_device(ordinal);
    if (!r) *device = ordinal;
    return r;
}

HV_EXPORT CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev) {
    if (!pi) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = hv_check_device(dev);
    if (r) return r;
    if (attrib == 19) { /* CAN_MAP_HOST_MEMORY: NOT_CARRIED says when */
        *pi = hv_attrs[dev][19] && hv_region_can_map(dev);
        return CUDA_SUCCESS;
    }
    if (attrib >= 1 && attrib <= HV_ATTR_COUNT) {
        *pi = hv_attrs[dev][attrib];
        return CUDA_SUCCESS;
    }
    hvgpu_device_get_attribute_req_t q = { attrib, 0 };
    hvgpu_device_get_attribute_rep_t v;
    r = HV_ON(dev, hv_call(HVGPU_OP_DEVICE_GET_ATTRIBUTE, &q, sizeof q, NULL, 0, &v, sizeof v,
                           NULL, NULL, 0));
    if (!r) *pi = v.value;
    return r;
}

HV_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = hv_check_device(dev);
    if (r) return r;
    hvgpu_device_get_name_req_t q = { 0 };
    unsigned char rep[sizeof(hvgpu_device_get_name_rep_t) + 256];
    uint32_t n = 0;
    r = HV_ON(dev, hv_call(HVGPU_OP_DEVICE_GET_NAME, &q, sizeof q, NULL, 0, rep, sizeof rep - 1,
                           &n, NULL, 0));
    if (r) return r;
    hvgpu_device_get_name_rep_view_t v; /* a long name is cut */
    hvgpu_device_get_name_rep_decode(rep, n, &v);
    uint32_t sl = v.name.len < (uint32_t)len - 1 ? v.name.len : (uint32_t)len - 1;
    memcpy(name, v.name.data, sl);
    name[sl] = 0;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuDeviceGetUuid(unsigned char *uuid, CUdevice dev) {
    if (!uuid) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = hv_check_device(dev);
    if (!r) memcpy(uuid, hv_uuids[dev], HVGPU_UUID_SIZE);
    return r;
}

HV_EXPORT CUresult cuDeviceGetUuid_v2(unsigned char *uuid, CUdevice dev) {
    return cuDeviceGetUuid(uuid, dev);
}

HV_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = hv_check_device(dev);
    if (r) return r;
    hvgpu_device_total_mem_req_t q = { 0 };
    hvgpu_device_total_mem_rep_t v;
    r = HV_ON(dev, hv_call(HVGPU_OP_DEVICE_TOTAL_MEM, &q, sizeof q, NULL, 0, &v, sizeof v, NULL,
                           NULL, 0));
    if (!r) *bytes = (size_t)v.bytes;
    return r;
}

HV_EXPORT CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev) {
    if (!major || !minor) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = hv_check_device(dev);
    if (r) return r;
    *major = hv_attrs[dev][75];
    *minor = hv_attrs[dev][76];
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuDeviceGetPCIBusId(char *id, int len, CUdevice dev) {
    if (!id || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = hv_check_device(dev);
    if (r) return r;
    snprintf(id, (size_t)len, "%08x:%02x:%02x.0", hv_attrs[dev][50], hv_attrs[dev][33],
             hv_attrs[dev][34]);
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuDeviceGetByPCIBusId(CUdevice *dev, const char *id) {
    if (!dev || !id) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = ready();
    if (r) return r;
    for (int d = 0; d < hv_device_count; d++) {
        char mine[32];
        cuDeviceGetPCIBusId(mine, sizeof mine, d);
        if (!strcasecmp(mine, id) || !strcasecmp(mine + 4, id)) { *dev = d; return CUDA_SUCCESS; }
    }
    return CUDA_ERROR_INVALID_DEVICE;
}

HV_EXPORT CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer) {
    if (!can) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = hv_check_device(dev);
    if (!r) r = hv_check_device(peer);
    if (!r) *can = 0; /* peer access between vGPUs is not built */
    return r;
}

HV_EXPORT CUresult cuDeviceGetP2PAttribute(int *value, int attrib, CUdevice src, CUdevice dst) {
    (void)attrib;
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = hv_check_device(src);
    if (!r) r = hv_check_device(dst);
    if (!r) *value = 0;
    return r;
}

/* CUdevprop, as cuda.h lays it out: the attributes it gathers (deprecated by CUDA). */
typedef struct {
    int max_threads_per_block, max_threads_dim[3], max_grid_size[3], shared_mem_per_block,
        total_constant_memory, simd_width, mem_pitch, regs_per_block, clock_rate, texture_align;
} hv_devprop;

HV_EXPORT CUresult cuDeviceGetProperties(hv_devprop *p, CUdevice dev) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = hv_check_device(dev);
    if (r) return r;
    const int *a = hv_attrs[dev];
    /* CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK (1) .. TEXTURE_ALIGNMENT (14), in order */
    *p = (hv_devprop){ a[1], { a[2], a[3], a[4] }, { a[5], a[6], a[7] }, a[8], a[9], a[10],
                       a[11], a[12], a[13], a[14] };
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuDeviceGetTexture1DLinearMaxWidth(size_t *width, int format,
                                                      unsigned channels, CUdevice dev) {
    if (!width) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = hv_check_device(dev);
    if (r) return r;
    hvgpu_device_texture_1d_linear_max_width_req_t q = { (uint32_t)format, channels };
    hvgpu_device_texture_1d_linear_max_width_rep_t v;
    r = HV_ON(dev, hv_call(HVGPU_OP_DEVICE_TEXTURE_1D_LINEAR_MAX_WIDTH, &q, sizeof q, NULL, 0, &v,
                           sizeof v, NULL, NULL, 0));
    if (!r) *width = (size_t)v.width;
    return r;
}

/* Atomics of the device on host memory: the host's pinned memory, which is what the
   guest's device-mapped pinned memory is (the region), so the host driver's answer holds;
   asked MAX_ATOMIC_OPERATIONS operations at a time. */
HV_EXPORT CUresult cuDeviceGetHostAtomicCapabilities(unsigned *caps, const int *ops,
                                                     unsigned count, CUdevice dev) {
    if (!caps || (count && !ops)) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = hv_check_device(dev);
    for (unsigned done = 0; !r && done < count; done += HVGPU_MAX_ATOMIC_OPERATIONS) {
        unsigned k = count - done < HVGPU_MAX_ATOMIC_OPERATIONS ? count - done
                                                                 : HVGPU_MAX_ATOMIC_OPERATIONS;
        unsigned char body[sizeof(hvgpu_device_host_atomic_caps_req_t) +
                           4 * HVGPU_MAX_ATOMIC_OPERATIONS];
        hvgpu_device_host_atomic_caps_req_t q = { 4 * k };
        memcpy(body, &q, sizeof q);
        memcpy(body + sizeof q, ops + done, 4 * k);
        unsigned char rep[sizeof(hvgpu_device_host_atomic_caps_rep_t) +
                          4 * HVGPU_MAX_ATOMIC_OPERATIONS];
        uint32_t n = 0;
        r = HV_ON(dev, hv_call(HVGPU_OP_DEVICE_HOST_ATOMIC_CAPS, body, (uint32_t)(sizeof q + 4 * k),
                               NULL, 0, rep, sizeof rep, &n, NULL, 0));
        hvgpu_device_host_atomic_caps_rep_view_t v;
        if (!r && (hvgpu_device_host_atomic_caps_rep_decode(rep, n, &v) < 0 || v.caps.len != 4 * k))
            r = CUDA_ERROR_UNKNOWN;
        if (!r) memcpy(caps + done, v.caps.data, 4 * k);
    }
    return r;
}

/* Between two vGPUs, which cannot reach each other's memory (cuDeviceCanAccessPeer says
   0): no atomic is possible, as between two GPUs without a peer link. */
HV_EXPORT CUresult cuDeviceGetP2PAtomicCapabilities(unsigned *caps, const int *ops,
                                                    unsigned count, CUdevice src, CUdevice dst) {
    if (!caps || (count && !ops)) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = hv_check_device(src);
    if (!r) r = hv_check_device(dst);
    if (!r && src == dst) r = CUDA_ERROR_INVALID_DEVICE;
    if (!r) memset(caps, 0, (size_t)count * sizeof *caps);
    return r;
}

HV_EXPORT CUresult cuGetErrorName(CUresult error, const char **str) {
    const char *name, *text;
    if (!str) return CUDA_ERROR_INVALID_VALUE;
    if (!hvgpu_status_text(error, &name, &text)) { *str = NULL; return CUDA_ERROR_INVALID_VALUE; }
    *str = name;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuGetErrorString(CUresult error, const char **str) {
    const char *name, *text;
    if (!str) return CUDA_ERROR_INVALID_VALUE;
    if (!hvgpu_status_text(error, &name, &text)) { *str = NULL; return CUDA_ERROR_INVALID_VALUE; }
    *str = text;
    return CUDA_SUCCESS;
}

CUresult hv_lookup(const char *symbol, void **pfn, int version, int *status); /* proc.c */

HV_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                       unsigned long long flags, int *status) {
    (void)flags; /* per-thread default stream variants share the legacy ones */
    return hv_lookup(symbol, pfn, version, status);
}

HV_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                    unsigned long long flags) {
    (void)flags;
    return hv_lookup(symbol, pfn, version, NULL);
}

HV_EXPORT CUresult cuProfilerStart(void) { return CUDA_SUCCESS; }
HV_EXPORT CUresult cuProfilerStop(void) { return CUDA_SUCCESS; }
