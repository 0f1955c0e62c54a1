/* Driver entry points for a function's attributes and occupancy.
 *
 * What a function's queries answer is kept per function and vGPU: its
 * attributes come in one reply (FUNC_GET_ATTRIBUTES) the first time one is
 * asked for, and each occupancy answer is kept under its arguments. The
 * program's own cuFuncSetAttribute and cuFuncSetCacheConfig travel one-way (an
 * error the agent finds surfaces at a later call, as CUDA's asynchronous errors
 * do) and change what is kept as CUDA documents: the attribute set reads back
 * as set, and the function's occupancy answers are asked for again. After the
 * agent reports any error of a one-way frame, all is asked for again. Must not
 * answer from anything but the agent's replies and the program's own sets.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

/* CUfunction_attribute 0..31 asked for at once, as many as the agent answers (cuda.h 13.0
   has 16) */
#define FUNC_ATTRS HVGPU_MAX_FUNC_ATTRIBUTES
#define ATTR_SHARED_SIZE 1      /* static shared memory */
#define ATTR_FIRST_SETTABLE 8   /* 0..7 are read-only: CUDA refuses to set them */
#define ATTR_MAX_DYNAMIC_SHARED 8
#define ATTR_CARVEOUT 9
#define DEVICE_SHARED_OPTIN 97  /* CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
#define CACHE_PREFER_NONE 0     /* a function's cache preference before any is set */
#define OCC_FIRST 64            /* occupancy answers kept per function: a power of two ... */
#define OCC_MOST 4096           /* ... that doubles up to this; when full, it starts over */

enum { OCC_MAX_BLOCKS, OCC_AVAILABLE_SMEM };

struct occ_entry {
    int used, kind, a, b;       /* kind; block size and flags, or blocks and block size */
    uint64_t smem;
    int64_t value;
};

struct hv_answers {
    int filled;                 /* attr[] holds the agent's answers and the sets since */
    unsigned failures;          /* hv_oneway_failures() when this was last checked */
    uint32_t known;             /* bit i: the agent's driver has attribute i */
    int attr[FUNC_ATTRS];
    int cache_config;           /* the preference last sent; -1: not known */
    struct occ_entry *occ;      /* open addressing over occ_cap slots */
    unsigned occ_cap, occ_len;
};

static void forget_occupancy(struct hv_answers *a) {
    if (a->occ) memset(a->occ, 0, a->occ_cap * sizeof *a->occ);
    a->occ_len = 0;
}

/* The function's answers on the routed vGPU (its handle is valid there), with
   f->lock held; NULL (lock released) when out of memory. What was kept before
   the agent reported an error of a one-way frame is dropped: that frame may have
   been one of the sets the answers assumed. */
static struct hv_answers *answers(struct hv_func *f) {
    int d = hv_routed_device();
    pthread_mutex_lock(&f->lock);
    struct hv_answers *a = f->answers[d];
    if (!a) {
        a = f->answers[d] = calloc(1, sizeof *a);
        if (!a) { pthread_mutex_unlock(&f->lock); return NULL; }
        a->cache_config = CACHE_PREFER_NONE;
        a->failures = hv_oneway_failures();
    }
    unsigned failures = hv_oneway_failures();
    if (a->failures != failures) {
        a->failures = failures;
        a->filled = 0;
        a->cache_config = -1;
        forget_occupancy(a);
    }
    return a;
}

static CUresult fill(struct hv_answers *a, uint64_t handle) {
    if (a->filled) return CUDA_SUCCESS;
    hvgpu_func_get_attributes_req_t q = { handle, FUNC_ATTRS };
    unsigned char rep[sizeof(hvgpu_func_get_attributes_rep_t) + 4 * FUNC_ATTRS];
    uint32_t n = 0;
    CUresult r = hv_call(HVGPU_OP_FUNC_GET_ATTRIBUTES, &q, sizeof q, NULL, 0, rep, sizeof rep, &n,
                         NULL, 0);
    if (r) return r;
    hvgpu_func_get_attributes_rep_view_t v;
    if (hvgpu_func_get_attributes_rep_decode(rep, n, &v) < 0) return CUDA_ERROR_INVALID_VALUE;
    uint32_t count = v.values.len / 4; /* at most FUNC_ATTRS: rep holds no more */
    memset(a->attr, 0, sizeof a->attr);
    memcpy(a->attr, v.values.data, 4 * count);
    a->known = v.fixed.known & (count >= 32 ? 0xFFFFFFFFu : (1u << count) - 1);
    a->filled = 1;
    return CUDA_SUCCESS;
}

static CUresult get_attribute(struct hv_func *f, uint64_t handle, int *value, int attrib) {
    if (attrib < 0 || attrib >= FUNC_ATTRS) { /* past what is kept: the agent's driver says */
        hvgpu_func_get_attribute_req_t q = { handle, attrib };
        hvgpu_func_get_attribute_rep_t v;
        CUresult r = hv_call(HVGPU_OP_FUNC_GET_ATTRIBUTE, &q, sizeof q, NULL, 0, &v, sizeof v,
                             NULL, NULL, 0);
        if (!r) *value = v.value;
        return r;
    }
    struct hv_answers *a = answers(f);
    if (!a) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = fill(a, handle);
    if (!r && !(a->known >> attrib & 1)) r = CUDA_ERROR_INVALID_VALUE; /* unknown there */
    if (!r) *value = a->attr[attrib];
    pthread_mutex_unlock(&f->lock);
    return r;
}

static CUresult set_attribute(struct hv_func *f, uint64_t handle, int attrib, int value) {
    if (attrib >= 0 && attrib < ATTR_FIRST_SETTABLE) return CUDA_ERROR_INVALID_VALUE; /* read-only */
    struct hv_answers *a = answers(f);
    if (!a) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = CUDA_SUCCESS;
    /* The dynamic shared memory limit and the carveout preference read back as set;
       how the cluster attributes (and any newer ones) combine is the driver's, so
       after a set of one of those, all are asked for again. */
    int reads_back = attrib == ATTR_MAX_DYNAMIC_SHARED || attrib == ATTR_CARVEOUT;
    if (reads_back) {
        r = fill(a, handle);
        if (!r && attrib == ATTR_MAX_DYNAMIC_SHARED) {
            int optin = 0;
            if (value < 0 || (cuDeviceGetAttribute(&optin, DEVICE_SHARED_OPTIN,
                                                   hv_routed_device()) == CUDA_SUCCESS &&
                              optin > 0 && value > optin - a->attr[ATTR_SHARED_SIZE]))
                r = CUDA_ERROR_INVALID_VALUE; /* more than the device lets a block have */
        }
        if (!r && (a->known >> attrib & 1) && a->attr[attrib] == value) goto out; /* as it is */
    }
    if (!r) {
        hvgpu_func_set_attribute_req_t q = { handle, attrib, value };
        r = hv_oneway(HVGPU_OP_FUNC_SET_ATTRIBUTE, &q, sizeof q, NULL, 0);
    }
    if (!r) {
        if (reads_back) a->attr[attrib] = value;
        else a->filled = 0;
        forget_occupancy(a);
    }
out:
    pthread_mutex_unlock(&f->lock);
    return r;
}

/* CUdevice_attribute numbers of the limits a launch is held to. */
enum { DEV_MAX_THREADS = 1, DEV_MAX_BLOCK_X = 2, DEV_MAX_GRID_X = 5 };
#define ATTR_MAX_THREADS 0      /* CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK */

/* What the driver's cuLaunchKernel refuses at the call, from what the guest holds: the
   vGPU's limits (fetched at init) and the function's attributes (fetched once per
   function, then kept as occupancy queries keep them). A limit the agent did not give
   (0) is not applied: the executor's driver still judges the launch. */
CUresult hv_launch_check(struct hv_func *f, uint64_t handle, const unsigned grid[3],
                         const unsigned block[3], unsigned smem) {
    const int *dev = hv_attrs[hv_routed_device()];
    uint64_t threads = 1;
    for (int i = 0; i < 3; i++) {
        if (!grid[i] || !block[i]) return CUDA_ERROR_INVALID_VALUE;
        int most_block = dev[DEV_MAX_BLOCK_X + i], most_grid = dev[DEV_MAX_GRID_X + i];
        if ((most_block > 0 && block[i] > (unsigned)most_block) ||
            (most_grid > 0 && grid[i] > (unsigned)most_grid))
            return CUDA_ERROR_INVALID_VALUE;
        threads *= block[i];
    }
    if (dev[DEV_MAX_THREADS] > 0 && threads > (uint64_t)dev[DEV_MAX_THREADS])
        return CUDA_ERROR_INVALID_VALUE;
    struct hv_answers *a = answers(f);
    if (!a) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = fill(a, handle);
    if (!r) {
        /* the function's own limits: its registers bound its block, its static shared
           memory and the attribute set (or not) bound the dynamic shared memory */
        if ((a->known >> ATTR_MAX_THREADS & 1) && a->attr[ATTR_MAX_THREADS] > 0 &&
            threads > (uint64_t)a->attr[ATTR_MAX_THREADS])
            r = CUDA_ERROR_INVALID_VALUE; /* the driver's status for it (seen on the H200) */
        else if ((a->known >> ATTR_MAX_DYNAMIC_SHARED & 1) &&
                 a->attr[ATTR_MAX_DYNAMIC_SHARED] >= 0 &&
                 smem > (unsigned)a->attr[ATTR_MAX_DYNAMIC_SHARED])
            r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&f->lock);
    if (r && hv_trace_enabled())
        hv_log("launch of %s <<<(%u,%u,%u),(%u,%u,%u),%u>>> refused as the driver refuses it "
               "(%d)", f->name ? f->name : "?", grid[0], grid[1], grid[2], block[0], block[1],
               block[2], smem, r);
    return r;
}

static CUresult set_cache_config(struct hv_func *f, uint64_t handle, int config) {
    struct hv_answers *a = answers(f);
    if (!a) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = CUDA_SUCCESS;
    if (a->cache_config != config) {
        hvgpu_func_set_cache_config_req_t q = { handle, (uint32_t)config };
        r = hv_oneway(HVGPU_OP_FUNC_SET_CACHE_CONFIG, &q, sizeof q, NULL, 0);
        if (!r) {
            a->cache_config = config;
            forget_occupancy(a); /* the preference may change how much shared memory an SM has */
        }
    }
    pthread_mutex_unlock(&f->lock);
    return r;
}

static unsigned occ_slot(const struct occ_entry *e, unsigned cap) {
    uint64_t h = (uint64_t)(unsigned)e->kind * 0x9E3779B97F4A7C15ull;
    h = (h ^ (unsigned)e->a) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (unsigned)e->b) * 0x94D049BB133111EBull;
    h = (h ^ e->smem) * 0x9E3779B97F4A7C15ull;
    return (unsigned)(h >> 32) & (cap - 1);
}

static struct occ_entry *occ_find(struct hv_answers *a, const struct occ_entry *key) {
    if (!a->occ) return NULL;
    for (unsigned i = occ_slot(key, a->occ_cap);; i = (i + 1) & (a->occ_cap - 1)) {
        struct occ_entry *e = &a->occ[i];
        if (!e->used) return NULL;
        if (e->kind == key->kind && e->a == key->a && e->b == key->b && e->smem == key->smem)
            return e;
    }
}

static void occ_keep(struct hv_answers *a, struct occ_entry *entry) {
    if (2 * (a->occ_len + 1) > a->occ_cap) { /* kept at most half full */
        unsigned cap = a->occ_cap ? 2 * a->occ_cap : OCC_FIRST;
        struct occ_entry *old = a->occ, *grown = cap <= OCC_MOST ? calloc(cap, sizeof *grown) : NULL;
        if (!grown) { /* at the limit (or out of memory): start over */
            forget_occupancy(a);
            if (!a->occ) return;
        } else {
            unsigned old_cap = a->occ_cap;
            a->occ = grown;
            a->occ_cap = cap;
            a->occ_len = 0;
            for (unsigned i = 0; i < old_cap; i++)
                if (old[i].used) occ_keep(a, &old[i]);
            free(old);
        }
    }
    unsigned i = occ_slot(entry, a->occ_cap);
    while (a->occ[i].used) i = (i + 1) & (a->occ_cap - 1);
    a->occ[i] = *entry;
    a->occ[i].used = 1;
    a->occ_len++;
}

/* An occupancy answer: kept, or asked for (op, request q) and kept. */
static CUresult occupancy(struct hv_func *f, struct occ_entry key, uint16_t op, const void *q,
                          uint32_t qlen, int64_t *value) {
    struct hv_answers *a = answers(f);
    if (!a) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = CUDA_SUCCESS;
    struct occ_entry *e = occ_find(a, &key);
    if (e) {
        *value = e->value;
    } else {
        union {
            hvgpu_occupancy_max_blocks_rep_t blocks;
            hvgpu_occupancy_available_smem_rep_t smem;
        } v;
        r = hv_call(op, q, qlen, NULL, 0, &v, sizeof v, NULL, NULL, 0);
        if (!r) {
            key.value = *value = key.kind == OCC_MAX_BLOCKS ? v.blocks.blocks : (int64_t)v.smem.bytes;
            occ_keep(a, &key);
        }
    }
    pthread_mutex_unlock(&f->lock);
    return r;
}

static CUresult max_blocks(struct hv_func *f, uint64_t handle, int *blocks, int block_size,
                           size_t smem, unsigned flags) {
    hvgpu_occupancy_max_blocks_req_t q = { handle, block_size, smem, flags };
    struct occ_entry key = { 0, OCC_MAX_BLOCKS, block_size, (int)flags, smem, 0 };
    int64_t value;
    CUresult r = occupancy(f, key, HVGPU_OP_OCCUPANCY_MAX_BLOCKS, &q, sizeof q, &value);
    if (!r) *blocks = (int)value;
    return r;
}

static CUresult available_smem(struct hv_func *f, uint64_t handle, size_t *bytes, int blocks,
                               int block_size) {
    hvgpu_occupancy_available_smem_req_t q = { handle, blocks, block_size };
    struct occ_entry key = { 0, OCC_AVAILABLE_SMEM, blocks, block_size, 0, 0 };
    int64_t value;
    CUresult r = occupancy(f, key, HVGPU_OP_OCCUPANCY_AVAILABLE_SMEM, &q, sizeof q, &value);
    if (!r) *bytes = (size_t)value;
    return r;
}

HV_EXPORT CUresult cuFuncGetAttribute(int *value, int attrib, CUfunction f) {
    if (!value || !f) return CUDA_ERROR_INVALID_VALUE;
    return ON_FUNCTION(f, get_attribute, value, attrib);
}

HV_EXPORT CUresult cuFuncSetAttribute(CUfunction f, int attrib, int value) {
    if (!f) return CUDA_ERROR_INVALID_VALUE;
    return ON_FUNCTION(f, set_attribute, attrib, value);
}

HV_EXPORT CUresult cuKernelGetAttribute(int *value, int attrib, CUkernel k, CUdevice dev) {
    return HV_ON(dev, cuFuncGetAttribute(value, attrib, k));
}

HV_EXPORT CUresult cuKernelSetAttribute(int attrib, int value, CUkernel k, CUdevice dev) {
    return HV_ON(dev, cuFuncSetAttribute(k, attrib, value));
}

HV_EXPORT CUresult cuFuncSetCacheConfig(CUfunction f, int config) {
    if (!f) return CUDA_ERROR_INVALID_VALUE;
    if (config < 0 || config > 3) return CUDA_ERROR_INVALID_VALUE; /* not a CUfunc_cache */
    return ON_FUNCTION(f, set_cache_config, config);
}

HV_EXPORT CUresult cuKernelSetCacheConfig(CUkernel k, int config, CUdevice dev) {
    return HV_ON(dev, cuFuncSetCacheConfig(k, config));
}

HV_EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    int *blocks, CUfunction f, int block_size, size_t smem, unsigned flags) {
    if (!blocks || !f) return CUDA_ERROR_INVALID_VALUE;
    return ON_FUNCTION(f, max_blocks, blocks, block_size, smem, flags);
}

HV_EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, CUfunction f,
                                                               int block_size, size_t smem) {
    return cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(blocks, f, block_size, smem, 0);
}

HV_EXPORT CUresult cuOccupancyAvailableDynamicSMemPerBlock(size_t *bytes, CUfunction f,
                                                           int blocks, int block_size) {
    if (!bytes || !f) return CUDA_ERROR_INVALID_VALUE;
    return ON_FUNCTION(f, available_smem, bytes, blocks, block_size);
}

static CUresult clusters(int which, int *value, CUfunction f, const hv_launch_config *c) {
    if (!value || !f || !c || c->nattrs > HVGPU_MAX_LAUNCH_ATTRS || (c->nattrs && !c->attrs))
        return CUDA_ERROR_INVALID_VALUE;
    unsigned char body[sizeof(hvgpu_occupancy_clusters_req_t) +
                       HVGPU_MAX_LAUNCH_ATTRS * sizeof(hv_launch_attribute)];
    uint32_t attrs_len = c->nattrs * (uint32_t)sizeof(hv_launch_attribute);
    hvgpu_occupancy_clusters_req_t q = { (uint32_t)which, 0, c->gx, c->gy, c->gz,
                                         c->bx, c->by, c->bz, c->smem, attrs_len };
    int device;
    uint64_t handle;
    CUresult r = hv_func_resolve(f, &device, &handle);
    if (r) return r;
    q.function = handle;
    memcpy(body, &q, sizeof q);
    if (attrs_len) memcpy(body + sizeof q, c->attrs, attrs_len);
    hvgpu_occupancy_clusters_rep_t v;
    r = HV_ON(device, hv_call(HVGPU_OP_OCCUPANCY_CLUSTERS, body, (uint32_t)(sizeof q + attrs_len),
                              NULL, 0, &v, sizeof v, NULL, NULL, 0));
    if (!r) *value = v.value;
    return r;
}

HV_EXPORT CUresult cuOccupancyMaxActiveClusters(int *clusters_, CUfunction f,
                                                const hv_launch_config *c) {
    return clusters(0, clusters_, f, c);
}

HV_EXPORT CUresult cuOccupancyMaxPotentialClusterSize(int *size, CUfunction f,
                                                      const hv_launch_config *c) {
    return clusters(1, size, f, c);
}

/* The block size with the most resident threads, asked block size by block size
   (the callback for dynamic shared memory runs here, in the guest). */
HV_EXPORT CUresult cuOccupancyMaxPotentialBlockSizeWithFlags(
    int *min_grid, int *block_size, CUfunction f, size_t (*smem_for)(int), size_t smem,
    int limit, unsigned flags) {
    if (!min_grid || !block_size || !f) return CUDA_ERROR_INVALID_VALUE;
    int max_threads = 0, sms = 0, dev = hv_current_or_primary()->device;
    CUresult r = cuFuncGetAttribute(&max_threads, 0 /* MAX_THREADS_PER_BLOCK */, f);
    if (!r) r = cuDeviceGetAttribute(&sms, 16 /* MULTIPROCESSOR_COUNT */, dev);
    if (r) return r;
    if (limit > 0 && limit < max_threads) max_threads = limit;
    int best_threads = 0, best_size = 0, best_blocks = 0;
    for (int size = (max_threads / 32) * 32; size > 0; size -= 32) {
        int blocks = 0;
        r = cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
            &blocks, f, size, smem_for ? smem_for(size) : smem, flags);
        if (r) return r;
        if (blocks * size > best_threads) {
            best_threads = blocks * size;
            best_size = size;
            best_blocks = blocks;
        }
    }
    *block_size = best_size;
    *min_grid = best_blocks * sms;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuOccupancyMaxPotentialBlockSize(int *min_grid, int *block_size, CUfunction f,
                                                    size_t (*smem_for)(int), size_t smem,
                                                    int limit) {
    return cuOccupancyMaxPotentialBlockSizeWithFlags(min_grid, block_size, f, smem_for, smem,
                                                     limit, 0);
}
