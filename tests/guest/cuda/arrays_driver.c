/* Arrays, 2D/3D copies, texture and surface objects through the shim's driver entry
 * points (no cuda.h: the structures are spelled out as cuda.h lays them out). Prints
 * one line per check, "name ok" or "name FAILED ..."; a kernel (the test double's
 * tex_copy) reads an array through the texture object's value. */
#include <stdio.h>
#include <stddef.h>
#include <string.h>

typedef unsigned long long CUdeviceptr;
typedef struct { size_t w, h, d; int format; unsigned ch, flags; } A3D;
typedef struct {
    size_t sx, sy; int stype; const void *shost; CUdeviceptr sdev; void *sarr; size_t spitch;
    size_t dx, dy; int dtype; void *dhost; CUdeviceptr ddev; void *darr; size_t dpitch;
    size_t width, height;
} M2D;
typedef struct {
    size_t x, y, z, lod; int type; const void *host; CUdeviceptr dev; void *arr, *res;
    size_t pitch, height;
} SIDE;
typedef struct { SIDE s, d; size_t width, height, depth; } M3D;

int cuInit(unsigned flags);
int cuDevicePrimaryCtxRetain(void **ctx, int dev);
int cuCtxSetCurrent(void *ctx);
int cuCtxSynchronize(void);
int cuModuleLoadData(void **module, const void *image);
int cuModuleGetFunction(void **fn, void *module, const char *name);
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned smem, void *stream, void **params, void **extra);
int cuMemAlloc_v2(CUdeviceptr *p, size_t n);
int cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned elem);
int cuMemFree_v2(CUdeviceptr p);
int cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n);
int cuMemcpy2D_v2(const M2D *c);
int cuMemcpy3D_v2(const M3D *c);
int cuMemcpyHtoA_v2(void *dst, size_t off, const void *src, size_t n);
int cuMemcpyAtoH_v2(void *dst, void *src, size_t off, size_t n);
int cuArray3DCreate_v2(void **a, const A3D *d);
int cuArray3DGetDescriptor_v2(A3D *d, void *a);
int cuArrayDestroy(void *a);
int cuMipmappedArrayCreate(void **m, const A3D *d, unsigned levels);
int cuMipmappedArrayGetLevel(void **a, void *m, unsigned level);
int cuMipmappedArrayDestroy(void *m);
int cuTexObjectCreate(unsigned long long *t, const void *res, const void *tex, const void *view);
int cuTexObjectDestroy(unsigned long long t);
int cuSurfObjectCreate(unsigned long long *s, const void *res);
int cuSurfObjectDestroy(unsigned long long s);
int cuStreamSynchronize(void *stream);
int cuGraphCreate(void **graph, unsigned flags);
int cuGraphAddMemcpyNode(void **node, void *graph, void *const *deps, size_t ndeps,
                         const M3D *p, void *ctx);
int cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags);
int cuGraphLaunch(void *exec, void *stream);
int cuGraphExecDestroy(void *exec);
int cuGraphDestroy(void *graph);

enum { HOST = 1, DEVICE = 2, ARRAY = 3, FLOAT = 0x20, U8 = 0x01, SURFACE = 0x02 };
static int failed;

static void check(const char *name, int ok, int status) {
    if (ok) printf("%s ok\n", name);
    else { printf("%s FAILED (status %d)\n", name, status); failed = 1; }
}

static void res_array(unsigned char res[144], void *array) {
    memset(res, 0, 144);
    memcpy(res + 8, &array, sizeof array);
}

int main(void) {
    void *ctx, *array, *cube, *mod, *fn;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx)) return 2;

    /* a 300-byte x 16 row image: host -> array -> pitched device -> host */
    unsigned char src[16][300], back[16][300];
    for (int r = 0; r < 16; r++) for (int c = 0; c < 300; c++) src[r][c] = (unsigned char)(r * 7 + c);
    A3D desc = { 75, 16, 0, FLOAT, 1, SURFACE };
    int st = cuArray3DCreate_v2(&array, &desc);
    check("array_create", !st, st);
    A3D got;
    st = cuArray3DGetDescriptor_v2(&got, array);
    check("array_descriptor", !st && got.w == 75 && got.h == 16 && got.format == FLOAT &&
          got.flags == SURFACE, st);
    CUdeviceptr pitched;
    size_t pitch;
    st = cuMemAllocPitch_v2(&pitched, &pitch, 300, 16, 4);
    check("alloc_pitch", !st && pitch >= 300, st);
    M2D in = { 0, 0, HOST, src, 0, NULL, 300, 0, 0, ARRAY, NULL, 0, array, 0, 300, 16 };
    M2D across = { 0, 0, ARRAY, NULL, 0, array, 0, 0, 0, DEVICE, NULL, pitched, NULL, pitch, 300, 16 };
    M2D out = { 0, 0, DEVICE, NULL, pitched, NULL, pitch, 0, 0, HOST, back, 0, NULL, 300, 300, 16 };
    memset(back, 0, sizeof back);
    st = cuMemcpy2D_v2(&in);
    if (!st) st = cuMemcpy2D_v2(&across);
    if (!st) st = cuMemcpy2D_v2(&out);
    check("pitched_2d_through_array", !st && !memcmp(src, back, sizeof src), st);
    /* a sub-rectangle out of the array: rows 3..7, bytes 40..99 */
    unsigned char part[5][60];
    M2D sub = { 40, 3, ARRAY, NULL, 0, array, 0, 0, 0, HOST, part, 0, NULL, 60, 60, 5 };
    st = cuMemcpy2D_v2(&sub);
    int same = !st;
    for (int r = 0; r < 5 && same; r++) same = !memcmp(part[r], &src[3 + r][40], 60);
    check("array_sub_rectangle", same, st);
    /* past the array's rows: refused, not clipped */
    M2D past = { 0, 10, ARRAY, NULL, 0, array, 0, 0, 0, HOST, back, 0, NULL, 300, 300, 7 };
    st = cuMemcpy2D_v2(&past);
    check("past_the_array_refused", st == 1, st);

    /* a 3D array of 4 x 3 x 2 bytes, there by cuMemcpy3D and a box back */
    unsigned char vol[2][3][4], box[2][2][2];
    for (int i = 0; i < 24; i++) ((unsigned char *)vol)[i] = (unsigned char)(i * 11);
    A3D d3 = { 4, 3, 2, U8, 1, 0 };
    void *volume;
    st = cuArray3DCreate_v2(&volume, &d3);
    M3D there = { { 0, 0, 0, 0, HOST, vol, 0, NULL, NULL, 4, 3 },
                  { 0, 0, 0, 0, ARRAY, NULL, 0, volume, NULL, 0, 0 }, 4, 3, 2 };
    M3D fetch = { { 1, 1, 0, 0, ARRAY, NULL, 0, volume, NULL, 0, 0 },
                  { 0, 0, 0, 0, HOST, box, 0, NULL, NULL, 2, 2 }, 2, 2, 2 };
    if (!st) st = cuMemcpy3D_v2(&there);
    if (!st) st = cuMemcpy3D_v2(&fetch);
    same = !st;
    for (int z = 0; z < 2; z++) for (int y = 0; y < 2; y++) for (int x = 0; x < 2; x++)
        same = same && box[z][y][x] == vol[z][1 + y][1 + x];
    check("volume_box", same, st);

    /* 1D forms along the first row */
    float row[8] = { 1, 2, 3, 4, 5, 6, 7, 8 }, row_back[8] = { 0 };
    st = cuMemcpyHtoA_v2(array, 16, row, sizeof row);
    if (!st) st = cuMemcpyAtoH_v2(row_back, array, 16, sizeof row_back);
    check("one_row_forms", !st && !memcmp(row, row_back, sizeof row), st);

    /* a texture object over the array, read by a kernel given its value */
    unsigned char res[144], tex[104] = { 0 };
    res_array(res, array);
    unsigned long long t = 0, s = 0;
    st = cuTexObjectCreate(&t, res, tex, NULL);
    check("texture_object", !st && t, st);
    const char image[] = "__global__ void tex_copy(unsigned long long t, float *o, int n)";
    CUdeviceptr o;
    float first[4];
    int n = 4;
    st = cuModuleLoadData(&mod, image);
    if (!st) st = cuModuleGetFunction(&fn, mod, "tex_copy");
    if (!st) st = cuMemAlloc_v2(&o, sizeof first);
    void *params[] = { &t, &o, &n };
    if (!st) st = cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
    if (!st) st = cuMemcpyDtoH_v2(first, o, sizeof first);
    check("kernel_reads_texture", !st && !memcmp(first, src[0], sizeof first), st);
    st = cuSurfObjectCreate(&s, res);
    check("surface_object", !st && s && s != t, st);
    st = cuSurfObjectDestroy(s);
    if (!st) st = cuTexObjectDestroy(t);
    check("objects_destroyed", !st, st);
    st = cuTexObjectDestroy(t);
    check("second_destroy_refused", st == 1, st);

    /* a graph built by hand copies pageable memory into the array and a box back out,
       reading and writing the program's memory at each launch */
    void *graph, *exec, *up, *down;
    unsigned char gin[3][4], gout[2][2];
    M3D gup = { { 0, 0, 0, 0, HOST, gin, 0, NULL, NULL, 4, 3 },
                { 0, 0, 0, 0, ARRAY, NULL, 0, volume, NULL, 0, 0 }, 4, 3, 1 };
    M3D gdown = { { 2, 1, 0, 0, ARRAY, NULL, 0, volume, NULL, 0, 0 },
                  { 0, 0, 0, 0, HOST, gout, 0, NULL, NULL, 2, 2 }, 2, 2, 1 };
    st = cuGraphCreate(&graph, 0);
    if (!st) st = cuGraphAddMemcpyNode(&up, graph, NULL, 0, &gup, ctx);
    if (!st) st = cuGraphAddMemcpyNode(&down, graph, &up, 1, &gdown, ctx);
    if (!st) st = cuGraphInstantiateWithFlags(&exec, graph, 0);
    same = !st;
    for (int round = 0; round < 2 && same; round++) {
        for (int i = 0; i < 12; i++) ((unsigned char *)gin)[i] = (unsigned char)(i + 40 * round);
        memset(gout, 0, sizeof gout);
        st = cuGraphLaunch(exec, NULL);
        if (!st) st = cuStreamSynchronize(NULL);
        same = !st && gout[0][0] == gin[1][2] && gout[0][1] == gin[1][3] &&
               gout[1][0] == gin[2][2] && gout[1][1] == gin[2][3];
    }
    if (!st) st = cuGraphExecDestroy(exec);
    if (!st) st = cuGraphDestroy(graph);
    check("graph_copy_nodes", same && !st, st);

    /* a mipmapped cubemap-free 2D array: a level is an array of its own size */
    A3D md = { 64, 64, 0, FLOAT, 4, 0 };
    void *mip, *level;
    A3D ld;
    st = cuMipmappedArrayCreate(&mip, &md, 3);
    if (!st) st = cuMipmappedArrayGetLevel(&level, mip, 2);
    if (!st) st = cuArray3DGetDescriptor_v2(&ld, level);
    check("mipmap_level", !st && ld.w == 16 && ld.h == 16, st);
    st = cuMipmappedArrayDestroy(mip);
    if (!st) st = cuArrayDestroy(array);
    if (!st) st = cuArrayDestroy(volume);
    if (!st) st = cuMemFree_v2(pitched);
    check("destroyed", !st, st);
    (void)cube;
    st = cuArrayDestroy(array);
    check("destroyed_array_unknown", st == 400, st);
    return failed;
}
