/* Driver entry points for virtual memory management (cuMemAddressReserve,
 * cuMemCreate, cuMemMap, cuMemSetAccess and their kin).
 *
 * Every call is a round trip to the executor, which does the real VMM call
 * and charges the slice's quota; none is on a hot path (frameworks map
 * memory when their pools grow). Only device memory of the guest's own
 * vGPUs is served, compressible or not, exportable as a POSIX file descriptor at
 * most: anything else (host or NUMA locations, fabric or Win32 handles, RDMA, usage
 * flags) returns CUDA_ERROR_NOT_SUPPORTED and says so once. cuMemExportToShareableHandle
 * gives the program a real descriptor, a sealed memfd holding the executor's token for
 * the memory (its vGPU and SHAREABLE_MAGIC first), which it may pass to another
 * process of the VM (SCM_RIGHTS) as it would the driver's; that process's
 * cuMemImportFromShareableHandle reads the token from it, and the VM's executor
 * gives it the same memory (hvgpu/host/executor/vmm.py).
 *
 * Addresses, handles and mappings belong to one vGPU (its executor is its own
 * process): a reservation to the current context's device, a handle to the
 * device its properties name (tagged as streams are, shim.h), and a
 * mapping to both, which must agree.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shim.h"

typedef unsigned long long CUmemGenericAllocationHandle;

typedef struct { int type, id; } hv_mem_location;           /* CUmemLocation */
typedef struct {                                             /* CUmemAllocationProp */
    int type, requested_handle_types;
    hv_mem_location location;
    void *win32_metadata;
    unsigned char compression, rdma;
    unsigned short usage;
    unsigned char reserved[4];
} hv_alloc_prop;
typedef struct { hv_mem_location location; int flags; } hv_access_desc; /* CUmemAccessDesc */
_Static_assert(sizeof(hv_alloc_prop) == 32 && sizeof(hv_access_desc) == HVGPU_ACCESS_DESC_SIZE,
               "cuda.h layouts");

enum { PINNED = 1, ON_DEVICE = 1, POSIX_FD = 1, READWRITE = 3 };

CUresult hv_device_location(const void *location, int *device, const char *api, int *once) {
    const hv_mem_location *l = location;
    if (!l) return CUDA_ERROR_INVALID_VALUE;
    if (l->type != ON_DEVICE) return hv_unsupported(api, once);
    CUresult r = cuInit(0);
    if (r) return r;
    if (l->id < 0 || l->id >= hv_device_count) return CUDA_ERROR_INVALID_DEVICE;
    *device = l->id;
    return CUDA_SUCCESS;
}

/* What the executor may be asked for: device memory, a POSIX fd handle at most, no flags
 * but a compression type (which the executor judges). */
static CUresult check_prop(const hv_alloc_prop *p, int *device) {
    static int managed, host, exportable, flags;
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    if (p->type != PINNED)
        return hv_unsupported("cuMemCreate of managed memory (only CU_MEM_ALLOCATION_TYPE_PINNED "
                              "is served)", &managed);
    CUresult r = hv_device_location(&p->location, device,
                                    "cuMemCreate of host or NUMA memory (only device memory "
                                    "is served)", &host);
    if (r) return r;
    if (p->requested_handle_types & ~POSIX_FD)
        return hv_unsupported("cuMemCreate of exportable memory (fabric or Win32 handles)",
                              &exportable);
    if (p->rdma || p->usage)
        return hv_unsupported("cuMemCreate of GPUDirect RDMA or usage-flagged memory", &flags);
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity, const hv_alloc_prop *prop,
                                                 int option) {
    static size_t cached[HV_MAX_DEVICES][2][2]; /* [device][option][compressible] */
    int device = -1;
    if (!granularity || option < 0 || option > 1) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_prop(prop, &device);
    if (r) return r;
    int c = prop->compression != 0;
    size_t g = c && prop->compression != 1 ? 0 /* the executor says why */
                                           : __atomic_load_n(&cached[device][option][c],
                                                             __ATOMIC_ACQUIRE);
    if (!g && !c) {
        hvgpu_mem_get_granularity_req_t q = { (uint32_t)option };
        hvgpu_mem_get_granularity_rep_t v;
        r = HV_ON(device, hv_call(HVGPU_OP_MEM_GET_GRANULARITY, &q, sizeof q, NULL, 0, &v,
                                  sizeof v, NULL, NULL, 0));
        if (r) return r;
        g = (size_t)v.granularity;
        __atomic_store_n(&cached[device][option][c], g, __ATOMIC_RELEASE);
    } else if (!g) {
        hvgpu_mem_get_granularity_of_req_t q = { (uint32_t)option, prop->compression };
        hvgpu_mem_get_granularity_of_rep_t v;
        r = HV_ON(device, hv_call(HVGPU_OP_MEM_GET_GRANULARITY_OF, &q, sizeof q, NULL, 0, &v,
                                  sizeof v, NULL, NULL, 0));
        if (r) return r;
        g = (size_t)v.granularity;
        if (prop->compression == 1) __atomic_store_n(&cached[device][option][c], g,
                                                     __ATOMIC_RELEASE);
    }
    *granularity = g;
    return CUDA_SUCCESS;
}

/* -- addresses ------------------------------------------------------------------ */

HV_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                       CUdeviceptr addr, unsigned long long flags) {
    if (!ptr) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cuInit(0);
    if (r) return r;
    hvgpu_mem_address_reserve_req_t q = { size, alignment, addr, flags };
    hvgpu_mem_address_reserve_rep_t v;
    r = hv_call(HVGPU_OP_MEM_ADDRESS_RESERVE, &q, sizeof q, NULL, 0, &v, sizeof v, NULL, NULL, 0);
    if (r) return r;
    hv_reserve_add(hv_routed_device(), v.dptr, size);
    *ptr = v.dptr;
    return CUDA_SUCCESS;
}

/* The vGPU whose reservation holds ptr, else the current one (whose executor says no). */
static int owner(CUdeviceptr ptr) {
    int d = hv_reserve_owner(ptr);
    return d >= 0 ? d : hv_routed_device();
}

HV_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    int device = owner(ptr);
    hvgpu_mem_address_free_req_t q = { ptr, size };
    CUresult r = HV_ON(device, hv_call(HVGPU_OP_MEM_ADDRESS_FREE, &q, sizeof q, NULL, 0, NULL, 0,
                                       NULL, NULL, 0));
    if (!r) hv_reserve_remove(device, ptr);
    return r;
}

/* -- physical memory ------------------------------------------------------------ */

HV_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                               const hv_alloc_prop *prop, unsigned long long flags) {
    int device = -1;
    if (!handle || flags) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_prop(prop, &device);
    if (r) return r;
    hvgpu_mem_create_req_t q = { size, PINNED, (uint32_t)prop->requested_handle_types, ON_DEVICE,
                                 0, prop->compression };
    hvgpu_mem_create_rep_t v;
    r = HV_ON(device, hv_call(HVGPU_OP_MEM_CREATE, &q, sizeof q, NULL, 0, &v, sizeof v, NULL,
                              NULL, 0));
    if (!r) *handle = (CUmemGenericAllocationHandle)(uintptr_t)hv_tag(device, v.handle);
    return r;
}

/* The vGPU a handle is of; -1 for a number no call of this shim handed out. */
static int handle_device(CUmemGenericAllocationHandle handle) {
    uint64_t d = handle >> HV_TAG_SHIFT;
    return cuInit(0) == CUDA_SUCCESS && d < (uint64_t)hv_device_count ? (int)d : -1;
}

static uint64_t handle_value(CUmemGenericAllocationHandle handle) {
    return handle & ((1ull << HV_TAG_SHIFT) - 1);
}

HV_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    int device = handle_device(handle);
    if (device < 0) return CUDA_ERROR_INVALID_HANDLE;
    hvgpu_mem_release_req_t q = { handle_value(handle) };
    return HV_ON(device, hv_call(HVGPU_OP_MEM_RELEASE, &q, sizeof q, NULL, 0, NULL, 0, NULL,
                                 NULL, 0));
}

/* -- shareable handles: a memfd holding the executor's token --------------------------- */

static const char SHAREABLE_MAGIC[8] = "hvgpuVMM";
struct shareable { char magic[8]; uint32_t device, reserved; unsigned char token[HVGPU_IPC_HANDLE_SIZE]; };

int hv_shareable_make(const char *magic, int device, const unsigned char *token) {
    struct shareable s = { .device = (uint32_t)device };
    memcpy(s.magic, magic, sizeof s.magic);
    memcpy(s.token, token, sizeof s.token);
    int fd = memfd_create("hvgpu-shareable", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return -1;
    if (write(fd, &s, sizeof s) != (ssize_t)sizeof s
            || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL)) {
        close(fd);
        return -1;
    }
    return fd;
}

int hv_shareable_read(const char *magic, int fd, int *device, unsigned char *token) {
    struct shareable s;
    if (pread(fd, &s, sizeof s, 0) != (ssize_t)sizeof s || memcmp(s.magic, magic, sizeof s.magic)
            || s.device >= (uint32_t)hv_device_count)
        return -1;
    *device = (int)s.device;
    memcpy(token, s.token, sizeof s.token);
    return 0;
}

HV_EXPORT CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle handle,
                                                int type, unsigned long long flags) {
    static int other;
    if (!shareable) return CUDA_ERROR_INVALID_VALUE;
    if (type != POSIX_FD)
        return hv_unsupported("cuMemExportToShareableHandle of other handle types than "
                              "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR", &other);
    int device = handle_device(handle);
    if (device < 0) return CUDA_ERROR_INVALID_HANDLE;
    hvgpu_mem_export_req_t q = { handle_value(handle), (uint32_t)type, (uint32_t)flags };
    if (q.flags != flags) return CUDA_ERROR_INVALID_VALUE;
    unsigned char rep[sizeof(hvgpu_mem_export_rep_t) + HVGPU_IPC_HANDLE_SIZE];
    uint32_t n = 0;
    CUresult r = HV_ON(device, hv_call(HVGPU_OP_MEM_EXPORT, &q, sizeof q, NULL, 0, rep, sizeof rep,
                                       &n, NULL, 0));
    if (r) return r;
    hvgpu_mem_export_rep_view_t v;
    if (hvgpu_mem_export_rep_decode(rep, n, &v) || v.token.len != HVGPU_IPC_HANDLE_SIZE)
        return CUDA_ERROR_UNKNOWN;
    int fd = hv_shareable_make(SHAREABLE_MAGIC, device, v.token.data);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    *(int *)shareable = fd;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                                  void *os_handle, int type) {
    static int other;
    if (!handle) return CUDA_ERROR_INVALID_VALUE;
    if (type != POSIX_FD)
        return hv_unsupported("cuMemImportFromShareableHandle of other handle types than "
                              "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR", &other);
    CUresult r = cuInit(0);
    if (r) return r;
    struct __attribute__((packed)) {
        hvgpu_mem_import_req_t q;
        unsigned char token[HVGPU_IPC_HANDLE_SIZE];
    } body = { { (uint32_t)type, HVGPU_IPC_HANDLE_SIZE }, { 0 } };
    int device = -1;
    if (hv_shareable_read(SHAREABLE_MAGIC, (int)(intptr_t)os_handle, &device, body.token))
        return CUDA_ERROR_INVALID_VALUE; /* no descriptor this shim made */
    hvgpu_mem_import_rep_t v;
    r = HV_ON(device, hv_call(HVGPU_OP_MEM_IMPORT, &body, sizeof body, NULL, 0, &v, sizeof v,
                              NULL, NULL, 0));
    if (!r) *handle = (CUmemGenericAllocationHandle)(uintptr_t)hv_tag(device, v.handle);
    return r;
}

HV_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(hv_alloc_prop *prop,
                                                          CUmemGenericAllocationHandle handle) {
    int device = handle_device(handle);
    if (!prop) return CUDA_ERROR_INVALID_VALUE;
    if (device < 0) return CUDA_ERROR_INVALID_HANDLE;
    hvgpu_mem_handle_props_req_t q = { handle_value(handle) };
    hvgpu_mem_handle_props_rep_t v;
    CUresult r = HV_ON(device, hv_call(HVGPU_OP_MEM_HANDLE_PROPS, &q, sizeof q, NULL, 0, &v,
                                       sizeof v, NULL, NULL, 0));
    if (r) return r;
    memset(prop, 0, sizeof *prop); /* what was made: device memory, no export handle */
    prop->type = PINNED;
    prop->location.type = ON_DEVICE;
    prop->location.id = device;
    prop->compression = (unsigned char)v.alloc_flags; /* what the driver granted */
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    if (!handle) return CUDA_ERROR_INVALID_VALUE;
    int device = owner((CUdeviceptr)(uintptr_t)addr);
    hvgpu_mem_retain_handle_req_t q = { (uint64_t)(uintptr_t)addr };
    hvgpu_mem_retain_handle_rep_t v;
    CUresult r = HV_ON(device, hv_call(HVGPU_OP_MEM_RETAIN_HANDLE, &q, sizeof q, NULL, 0, &v,
                                       sizeof v, NULL, NULL, 0));
    if (!r) *handle = (CUmemGenericAllocationHandle)(uintptr_t)hv_tag(device, v.handle);
    return r;
}

/* -- mappings ------------------------------------------------------------------------ */

HV_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                            CUmemGenericAllocationHandle handle, unsigned long long flags) {
    static int once;
    int device = handle_device(handle), at = hv_reserve_owner(ptr);
    if (device < 0) return CUDA_ERROR_INVALID_HANDLE;
    if (at >= 0 && at != device)
        return hv_unsupported("cuMemMap of one vGPU's memory into another's addresses", &once);
    hvgpu_mem_map_req_t q = { ptr, size, offset, handle_value(handle), flags };
    CUresult r = HV_ON(device, hv_call(HVGPU_OP_MEM_MAP, &q, sizeof q, NULL, 0, NULL, 0, NULL,
                                       NULL, 0));
    if (!r) HV_ON(device, (hv_range_add(ptr, size, HV_RANGE_MAPPED), CUDA_SUCCESS));
    return r;
}

HV_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    int device = owner(ptr);
    hvgpu_mem_unmap_req_t q = { ptr, size };
    CUresult r = HV_ON(device, hv_call(HVGPU_OP_MEM_UNMAP, &q, sizeof q, NULL, 0, NULL, 0, NULL,
                                       NULL, 0));
    if (!r) hv_ranges_drop(device, ptr, size, HV_RANGE_MAPPED);
    return r;
}

HV_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const hv_access_desc *desc,
                                  size_t count) {
    static int host, peers;
    if (!desc || !count || count > HVGPU_MAX_ACCESS_DESCS) return CUDA_ERROR_INVALID_VALUE;
    int device = owner(ptr);
    struct __attribute__((packed)) {
        hvgpu_mem_set_access_req_t q;
        hv_access_desc d[HVGPU_MAX_ACCESS_DESCS];
    } body;
    body.q = (hvgpu_mem_set_access_req_t){ ptr, size, (uint32_t)(count * sizeof *desc) };
    for (size_t i = 0; i < count; i++) {
        int on = -1;
        CUresult r = hv_device_location(&desc[i].location, &on,
                                        "cuMemSetAccess for host or NUMA locations", &host);
        if (r) return r;
        if (on != device) /* each vGPU's executor is its own process */
            return hv_unsupported("cuMemSetAccess for another vGPU (peer access between "
                                  "vGPUs)", &peers);
        body.d[i] = (hv_access_desc){ { ON_DEVICE, 0 }, desc[i].flags };
    }
    return HV_ON(device, hv_call(HVGPU_OP_MEM_SET_ACCESS, &body,
                                 (uint32_t)(sizeof body.q + count * sizeof *desc), NULL, 0, NULL,
                                 0, NULL, NULL, 0));
}

HV_EXPORT CUresult cuMemGetAccess(unsigned long long *flags, const hv_mem_location *location,
                                  CUdeviceptr ptr) {
    static int host;
    int on = -1;
    if (!flags) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = hv_device_location(location, &on, "cuMemGetAccess for host or NUMA locations",
                                    &host);
    if (r) return r;
    int device = owner(ptr);
    hvgpu_mem_get_access_req_t q = { ptr };
    hvgpu_mem_get_access_rep_t v;
    r = HV_ON(device, hv_call(HVGPU_OP_MEM_GET_ACCESS, &q, sizeof q, NULL, 0, &v, sizeof v, NULL,
                              NULL, 0));
    if (!r) *flags = on == device ? v.flags : 0; /* no vGPU reaches another's memory */
    return r;
}
