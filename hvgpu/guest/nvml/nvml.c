/* hvgpu's libnvidia-ml.so.1 for a VM: NVML answered from the host's agent.
 *
 * What pynvml, nvitop, gpustat and PyTorch ask at start and when they poll,
 * answered for this VM's vGPUs over the same data lane as the CUDA shim (its
 * wire.c, built into this library too): count, handles (by index, UUID, PCI
 * bus id), name, UUID, memory (total = the slice's quota, used = what the
 * host's ledger charges it), the slice's utilisation where the host measures
 * it, the VM's processes on each vGPU (only this VM's: the agent lists no
 * other's), PCI location and compute capability as the CUDA shim gives them.
 * Its connections are marked CAP_MONITOR, so a tool that only looks is not
 * listed as a process of the vGPU.
 *
 * It must never make up a number: what the host does not tell a VM
 * (temperature, power, clocks, fans, the display driver's version, ...) returns
 * NVML_ERROR_NOT_SUPPORTED, here or through the weak fallbacks of stubs.c.
 * It must not call exit() or abort(), nor load NVIDIA's NVML.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "shim.h"

typedef int nvmlReturn_t;
typedef struct nvml_dev *nvmlDevice_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};
#define NVML_INIT_FLAG_NO_GPUS 1u
#define NVML_VALUE_NOT_AVAILABLE_UINT 0xFFFFFFFFu /* no MIG: no instance ids */
#define NVML_STRUCT_VERSION(size, v) ((unsigned)(size) | ((unsigned)(v) << 24))

/* NVML's structures, as nvml.h lays them out (the ABI tools are built against). */
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_v2_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

/* CUdevice_attribute numbers read from the vGPU's attribute table */
enum { ATTR_COMPUTE_MODE = 20, ATTR_PCI_BUS = 33, ATTR_PCI_DEVICE = 34, ATTR_PCI_DOMAIN = 50,
       ATTR_CC_MAJOR = 75, ATTR_CC_MINOR = 76, ATTRS = 76 };

struct nvml_dev {
    int index;
    int known; /* name, uuid and attributes fetched */
    char name[96];
    char uuid[96];
    int32_t attrs[ATTRS + 1]; /* [n]: attribute n */
};

const char hv_client_software[] = "hvgpu NVML library";
const uint64_t hv_client_caps = HVGPU_CAP_PROGRESS | HVGPU_CAP_MONITOR;

/* No CUDA contexts here: a call goes to the vGPU hv_route() names (0 otherwise). */
struct hv_ctx *hv_current(void) { return NULL; }

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int refs;  /* nvmlInit calls not yet shut down */
static int count; /* the VM's vGPUs, asked at the first init */
static struct nvml_dev devs[HV_MAX_DEVICES];

static nvmlReturn_t from_cuda(CUresult r) {
    switch (r) {
    case CUDA_SUCCESS: return NVML_SUCCESS;
    case CUDA_ERROR_DEVICE_UNAVAILABLE: return NVML_ERROR_GPU_IS_LOST;
    case CUDA_ERROR_NO_DEVICE: return NVML_ERROR_DRIVER_NOT_LOADED;
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_INVALID_VALUE: return NVML_ERROR_INVALID_ARGUMENT;
    case CUDA_ERROR_NOT_SUPPORTED: return NVML_ERROR_NOT_SUPPORTED;
    case CUDA_ERROR_OUT_OF_MEMORY: return NVML_ERROR_MEMORY;
    default: return NVML_ERROR_UNKNOWN;
    }
}

/* One synchronous call to vGPU d's agent connection. */
static CUresult on(int d, uint16_t op, const void *body, uint32_t body_len, void *reply,
                   uint32_t cap, uint32_t *n) {
    int previous = hv_route(d);
    CUresult r = hv_call(op, body, body_len, NULL, 0, reply, cap, n, NULL, 0);
    hv_route(previous);
    return r;
}

/* A reply's variable field, NUL-terminated into out (a long one is cut). */
static void text_of(hvgpu_span_t field, char *out, size_t outlen) {
    size_t len = field.len < outlen - 1 ? field.len : outlen - 1;
    memcpy(out, field.data, len);
    out[len] = 0;
}

/* Name, UUID and attributes of vGPU d, asked once (they do not change). Filled in a
   local copy and published once under the lock: threads that already hold a handle
   read them meanwhile. A reply shorter than its fixed part is the host's error, never
   read past its end. */
static nvmlReturn_t learn(struct nvml_dev *dev) {
    if (__atomic_load_n(&dev->known, __ATOMIC_ACQUIRE)) return NVML_SUCCESS;
    int d = dev->index;
    struct nvml_dev got = { 0 };
    unsigned char rep[sizeof(hvgpu_device_get_attributes_rep_t) + 4 * ATTRS + 256];
    uint32_t n = 0;
    hvgpu_device_get_name_req_t nq = { 0 };
    CUresult r = on(d, HVGPU_OP_DEVICE_GET_NAME, &nq, sizeof nq, rep, sizeof rep, &n);
    if (r) return from_cuda(r);
    hvgpu_device_get_name_rep_view_t name;
    if (hvgpu_device_get_name_rep_decode(rep, n, &name) < 0) return NVML_ERROR_UNKNOWN;
    text_of(name.name, got.name, sizeof got.name);
    hvgpu_device_get_uuid_req_t uq = { 0 };
    if ((r = on(d, HVGPU_OP_DEVICE_GET_UUID, &uq, sizeof uq, rep, sizeof rep, &n))) return from_cuda(r);
    hvgpu_device_get_uuid_rep_view_t id;
    if (hvgpu_device_get_uuid_rep_decode(rep, n, &id) < 0 || id.uuid.len < HVGPU_UUID_SIZE)
        return NVML_ERROR_UNKNOWN;
    const unsigned char *u = id.uuid.data;
    snprintf(got.uuid, sizeof got.uuid,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
             u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
             u[14], u[15]);
    hvgpu_device_get_attributes_req_t aq = { 0, ATTRS };
    if ((r = on(d, HVGPU_OP_DEVICE_GET_ATTRIBUTES, &aq, sizeof aq, rep, sizeof rep, &n)))
        return from_cuda(r);
    hvgpu_device_get_attributes_rep_view_t a;
    if (hvgpu_device_get_attributes_rep_decode(rep, n, &a) < 0) return NVML_ERROR_UNKNOWN;
    memcpy(got.attrs + 1, a.values.data, a.values.len < 4 * ATTRS ? a.values.len : 4 * ATTRS);
    pthread_mutex_lock(&lock);
    if (!dev->known) {
        memcpy(dev->name, got.name, sizeof dev->name);
        memcpy(dev->uuid, got.uuid, sizeof dev->uuid);
        memcpy(dev->attrs, got.attrs, sizeof dev->attrs);
        __atomic_store_n(&dev->known, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}

static int initialised(void) { return __atomic_load_n(&refs, __ATOMIC_ACQUIRE) > 0; }

/* The device behind a handle this library gave, after init; its facts fetched. */
static nvmlReturn_t device_of(nvmlDevice_t h, struct nvml_dev **out) {
    if (!initialised()) return NVML_ERROR_UNINITIALIZED;
    if (!h || h < devs || h >= devs + count) return NVML_ERROR_INVALID_ARGUMENT;
    *out = h;
    return learn(h);
}

#define DEVICE(h, dev)                                                          \
    struct nvml_dev *dev;                                                       \
    do {                                                                        \
        nvmlReturn_t r_ = device_of(h, &dev);                                   \
        if (r_) return r_;                                                      \
    } while (0)

static nvmlReturn_t copy_text(const char *text, char *out, unsigned int length) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    size_t size = strlen(text) + 1; /* once: the check and the copy see one length */
    if (size > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, size);
    return NVML_SUCCESS;
}

/* -- init and shutdown ----------------------------------------------------- */

HV_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t r = NVML_SUCCESS;
    if (refs == 0) {
        hvgpu_device_get_count_rep_t c = { 0 };
        CUresult cr = on(0, HVGPU_OP_DEVICE_GET_COUNT, NULL, 0, &c, sizeof c, NULL);
        if (cr == CUDA_SUCCESS) {
            count = c.count < 0 ? 0 : c.count > HV_MAX_DEVICES ? HV_MAX_DEVICES : c.count;
            for (int d = 0; d < count; d++) devs[d].index = d;
        } else if (flags & NVML_INIT_FLAG_NO_GPUS) {
            count = 0; /* the caller asked to go on without GPUs */
        } else {
            /* wire.c has said on stderr why (no agent, no slice, ...) */
            r = from_cuda(cr) == NVML_ERROR_GPU_IS_LOST ? NVML_ERROR_GPU_IS_LOST
                                                         : NVML_ERROR_DRIVER_NOT_LOADED;
        }
    }
    if (r == NVML_SUCCESS) __atomic_add_fetch(&refs, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&lock);
    return r;
}

HV_EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
HV_EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

HV_EXPORT nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t r = refs > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (refs > 0) __atomic_sub_fetch(&refs, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&lock);
    return r; /* the connections stay: a later init reuses them */
}

HV_EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED:
        return "Driver Not Loaded (the hvgpu agent cannot be reached, or no GPU slice is "
               "attached to this VM)";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost (the connection to the hvgpu agent was lost)";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No Data";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

/* -- the system ---------------------------------------------------------------- */

HV_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    hvgpu_driver_get_version_rep_t v;
    uint32_t n = 0;
    CUresult r = on(0, HVGPU_OP_DRIVER_GET_VERSION, NULL, 0, &v, sizeof v, &n);
    if (r) return from_cuda(r);
    if (n < sizeof v) return NVML_ERROR_UNKNOWN; /* a short reply: nothing to say */
    *version = v.version;
    return NVML_SUCCESS;
}

HV_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    return nvmlSystemGetCudaDriverVersion(version);
}

/* The pid is one of this VM's (the processes this library lists are): its name is
   the VM's own to read. */
HV_EXPORT nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name,
                                                unsigned int length) {
    if (!name || !length) return NVML_ERROR_INVALID_ARGUMENT;
    char path[64], argv0[1024];
    snprintf(path, sizeof path, "/proc/%u/cmdline", pid);
    FILE *f = fopen(path, "re");
    if (!f) return NVML_ERROR_NOT_FOUND;
    size_t got = fread(argv0, 1, sizeof argv0 - 1, f);
    fclose(f);
    argv0[got] = 0;
    if (!got) return NVML_ERROR_NOT_FOUND;
    size_t len = strlen(argv0);
    if (len > length - 1) len = length - 1; /* as NVML does: cut to fit */
    memcpy(name, argv0, len);
    name[len] = 0;
    return NVML_SUCCESS;
}

/* -- devices: finding them ------------------------------------------------------ */

HV_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
    if (!initialised()) return NVML_ERROR_UNINITIALIZED;
    if (!n) return NVML_ERROR_INVALID_ARGUMENT;
    *n = (unsigned)count;
    return NVML_SUCCESS;
}

HV_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { return nvmlDeviceGetCount_v2(n); }

HV_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *h) {
    if (!initialised()) return NVML_ERROR_UNINITIALIZED;
    if (!h || index >= (unsigned)count) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = learn(&devs[index]);
    if (!r) *h = &devs[index];
    return r;
}

HV_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *h) {
    return nvmlDeviceGetHandleByIndex_v2(index, h);
}

HV_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *h) {
    if (!initialised()) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !h) return NVML_ERROR_INVALID_ARGUMENT;
    for (int d = 0; d < count; d++) {
        nvmlReturn_t r = learn(&devs[d]);
        if (r) return r;
        if (!strcasecmp(devs[d].uuid, uuid)) { *h = &devs[d]; return NVML_SUCCESS; }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* "domain:bus:device.function" or "bus:device.function", hex, any case. */
static int parse_bus_id(const char *id, unsigned *domain, unsigned *bus, unsigned *device) {
    unsigned fn;
    char end;
    if (sscanf(id, "%x:%x:%x.%x%c", domain, bus, device, &fn, &end) == 4) return 1;
    *domain = 0;
    return sscanf(id, "%x:%x.%x%c", bus, device, &fn, &end) == 3;
}

HV_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *id, nvmlDevice_t *h) {
    if (!initialised()) return NVML_ERROR_UNINITIALIZED;
    unsigned domain, bus, device;
    if (!id || !h || !parse_bus_id(id, &domain, &bus, &device)) return NVML_ERROR_INVALID_ARGUMENT;
    for (int d = 0; d < count; d++) {
        nvmlReturn_t r = learn(&devs[d]);
        if (r) return r;
        const int32_t *a = devs[d].attrs;
        if ((unsigned)a[ATTR_PCI_DOMAIN] == domain && (unsigned)a[ATTR_PCI_BUS] == bus &&
            (unsigned)a[ATTR_PCI_DEVICE] == device) {
            *h = &devs[d];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

HV_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *id, nvmlDevice_t *h) {
    return nvmlDeviceGetHandleByPciBusId_v2(id, h);
}

/* -- devices: what they are ------------------------------------------------------- */

HV_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t h, char *name, unsigned int length) {
    DEVICE(h, dev);
    return copy_text(dev->name, name, length);
}

HV_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t h, char *uuid, unsigned int length) {
    DEVICE(h, dev);
    return copy_text(dev->uuid, uuid, length);
}

HV_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t h, unsigned int *index) {
    DEVICE(h, dev);
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)dev->index;
    return NVML_SUCCESS;
}

/* /dev/nvidiaN has no meaning in a VM without one: the vGPU's index stands for it. */
HV_EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t h, unsigned int *minor) {
    return nvmlDeviceGetIndex(h, minor);
}

HV_EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t h, int *major, int *minor) {
    DEVICE(h, dev);
    if (!major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
    *major = dev->attrs[ATTR_CC_MAJOR];
    *minor = dev->attrs[ATTR_CC_MINOR];
    return NVML_SUCCESS;
}

/* CUDA's CUcomputemode and NVML's nvmlComputeMode_t share their numbers. */
HV_EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t h, int *mode) {
    DEVICE(h, dev);
    if (!mode) return NVML_ERROR_INVALID_ARGUMENT;
    *mode = dev->attrs[ATTR_COMPUTE_MODE];
    return NVML_SUCCESS;
}

HV_EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t h, unsigned int *is_mig) {
    DEVICE(h, dev);
    (void)dev;
    if (!is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *is_mig = 0; /* a vGPU is a slice of a whole GPU, not a MIG instance */
    return NVML_SUCCESS;
}

/* The bus id the CUDA shim gives (cuDeviceGetPCIBusId): CUDA and NVML agree on which
   device is which. No PCI device or vendor id travels to the VM: 0 there. */
HV_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t h, nvmlPciInfo_t *pci) {
    DEVICE(h, dev);
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    pci->domain = (unsigned)dev->attrs[ATTR_PCI_DOMAIN];
    pci->bus = (unsigned)dev->attrs[ATTR_PCI_BUS];
    pci->device = (unsigned)dev->attrs[ATTR_PCI_DEVICE];
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", pci->domain & 0xffff,
             pci->bus & 0xff, pci->device & 0xff);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.0", pci->domain, pci->bus & 0xff,
             pci->device & 0xff);
    return NVML_SUCCESS;
}

/* Peer access between two vGPUs is not built (the CUDA shim's cuDeviceCanAccessPeer
   says 0): NVML agrees. A device and itself: its own memory, which it always reaches.
   NCCL asks every pair, itself included, at start and gives up on any error. */
enum { NVML_P2P_STATUS_OK = 0, NVML_P2P_STATUS_NOT_SUPPORTED = 5 };
enum { NVML_P2P_CAPS_INDEX_READ = 0, NVML_P2P_CAPS_INDEX_PROP = 4, NVML_P2P_CAPS_INDEX_UNKNOWN = 5 };

HV_EXPORT nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t h1, nvmlDevice_t h2, int index,
                                              int *status) {
    DEVICE(h1, a);
    DEVICE(h2, b);
    if (!status || index < NVML_P2P_CAPS_INDEX_READ || index > NVML_P2P_CAPS_INDEX_UNKNOWN)
        return NVML_ERROR_INVALID_ARGUMENT;
    *status = a == b ? NVML_P2P_STATUS_OK : NVML_P2P_STATUS_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

/* -- devices: what they hold and do ------------------------------------------------ */

static nvmlReturn_t slice_memory(struct nvml_dev *dev, unsigned long long *total,
                                 unsigned long long *used) {
    unsigned char rep[sizeof(hvgpu_slice_info_rep_t) + 256];
    uint32_t n = 0;
    CUresult r = on(dev->index, HVGPU_OP_SLICE_INFO, NULL, 0, rep, sizeof rep, &n);
    if (r) return from_cuda(r);
    hvgpu_slice_info_rep_view_t s; /* the VM's name is not needed: it may be cut */
    if (hvgpu_slice_info_rep_decode(rep, n, &s) < 0) return NVML_ERROR_UNKNOWN;
    *total = s.fixed.mem;
    *used = s.fixed.mem_used < s.fixed.mem ? s.fixed.mem_used : s.fixed.mem;
    return NVML_SUCCESS;
}

HV_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t *m) {
    DEVICE(h, dev);
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long total, used;
    nvmlReturn_t r = slice_memory(dev, &total, &used);
    if (r) return r;
    m->total = total;
    m->used = used;
    m->free = total - used;
    return NVML_SUCCESS;
}

HV_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t h, nvmlMemory_v2_t *m) {
    DEVICE(h, dev);
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != NVML_STRUCT_VERSION(sizeof *m, 2))
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long total, used;
    nvmlReturn_t r = slice_memory(dev, &total, &used);
    if (r) return r;
    m->total = total;
    m->reserved = 0; /* the driver's own share is outside the slice */
    m->used = used;
    m->free = total - used;
    return NVML_SUCCESS;
}

/* gpu: the slice's share of the GPU's time busy, as the host measures it. The memory
   controller's busy share is not measured per slice: it reads 0. */
HV_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t h, nvmlUtilization_t *u) {
    DEVICE(h, dev);
    if (!u) return NVML_ERROR_INVALID_ARGUMENT;
    hvgpu_vgpu_utilization_rep_t v;
    uint32_t n = 0;
    CUresult r = on(dev->index, HVGPU_OP_VGPU_UTILIZATION, NULL, 0, &v, sizeof v, &n);
    if (r) return r == CUDA_ERROR_NOT_SUPPORTED ? NVML_ERROR_NOT_SUPPORTED : from_cuda(r);
    if (n < sizeof v || !v.known) return NVML_ERROR_NOT_SUPPORTED;
    u->gpu = v.gpu > 100 ? 100 : v.gpu;
    u->memory = 0;
    return NVML_SUCCESS;
}

struct process { unsigned pid; unsigned long long used; };

/* This VM's processes on the vGPU (the agent lists no other VM's). */
static nvmlReturn_t processes(struct nvml_dev *dev, struct process *out, unsigned *n) {
    unsigned char rep[sizeof(hvgpu_vgpu_processes_rep_t) + HVGPU_MAX_PROCESSES * 12 +
                      HVGPU_MAX_PROCESSES * (HVGPU_MAX_PROCESS_NAME + 1) + 64];
    uint32_t len = 0;
    CUresult r = on(dev->index, HVGPU_OP_VGPU_PROCESSES, NULL, 0, rep, sizeof rep, &len);
    if (r) return r == CUDA_ERROR_NOT_SUPPORTED ? NVML_ERROR_NOT_SUPPORTED : from_cuda(r);
    hvgpu_vgpu_processes_rep_view_t p;
    if (hvgpu_vgpu_processes_rep_decode(rep, len, &p) < 0) return NVML_ERROR_UNKNOWN;
    unsigned rows = p.fixed.count;
    if (rows > HVGPU_MAX_PROCESSES) rows = HVGPU_MAX_PROCESSES;
    if (p.fixed.pids_len < 4ull * rows || p.fixed.used_len < 8ull * rows ||
        p.pids.len != p.fixed.pids_len || p.used.len != p.fixed.used_len) /* both whole */
        return NVML_ERROR_UNKNOWN;
    for (unsigned i = 0; i < rows; i++) {
        uint32_t pid;
        uint64_t used;
        memcpy(&pid, p.pids.data + 4 * i, 4);
        memcpy(&used, p.used.data + 8 * i, 8);
        out[i].pid = pid;
        out[i].used = used;
    }
    *n = rows;
    return NVML_SUCCESS;
}

/* NVML's convention: with too small an array (or none), *count says how many there are
   and the call returns NVML_ERROR_INSUFFICIENT_SIZE; none at all is a success. */
static nvmlReturn_t running(nvmlDevice_t h, unsigned *count_io, void *infos, int v1) {
    DEVICE(h, dev);
    if (!count_io) return NVML_ERROR_INVALID_ARGUMENT;
    struct process rows[HVGPU_MAX_PROCESSES];
    unsigned n = 0;
    nvmlReturn_t r = processes(dev, rows, &n);
    if (r) return r;
    if (n > *count_io || (n && !infos)) {
        *count_io = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; i++) {
        if (v1) {
            nvmlProcessInfo_v1_t *o = (nvmlProcessInfo_v1_t *)infos + i;
            o->pid = rows[i].pid;
            o->usedGpuMemory = rows[i].used;
        } else {
            nvmlProcessInfo_v2_t *o = (nvmlProcessInfo_v2_t *)infos + i;
            o->pid = rows[i].pid;
            o->usedGpuMemory = rows[i].used;
            o->gpuInstanceId = o->computeInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT;
        }
    }
    *count_io = n;
    return NVML_SUCCESS;
}

HV_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t h, unsigned *n,
                                                               nvmlProcessInfo_v2_t *infos) {
    return running(h, n, infos, 0);
}

HV_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t h, unsigned *n,
                                                               nvmlProcessInfo_v2_t *infos) {
    return running(h, n, infos, 0);
}

HV_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t h, unsigned *n,
                                                            nvmlProcessInfo_v1_t *infos) {
    return running(h, n, infos, 1);
}

/* A vGPU runs CUDA work alone: no graphics contexts, and the VM's processes are no MPS
   clients of their own. */
static nvmlReturn_t none_running(nvmlDevice_t h, unsigned *n) {
    DEVICE(h, dev);
    (void)dev;
    if (!n) return NVML_ERROR_INVALID_ARGUMENT;
    *n = 0;
    return NVML_SUCCESS;
}

HV_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t h, unsigned *n,
                                                                void *infos) {
    (void)infos;
    return none_running(h, n);
}

HV_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t h, unsigned *n,
                                                                void *infos) {
    (void)infos;
    return none_running(h, n);
}

HV_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t h, unsigned *n,
                                                             void *infos) {
    (void)infos;
    return none_running(h, n);
}

HV_EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t h, unsigned *n,
                                                                  void *infos) {
    (void)infos;
    return none_running(h, n);
}
