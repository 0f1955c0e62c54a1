// Arrays, texture and surface objects and 2D/3D copies, as the runtime samples use them
// (simpleTexture, simpleSurfaceWrite, simplePitchLinearTexture, simpleTexture3D): prints
// what came back, line for line the same natively and through the shim.
#include <cstdio>
#include <cstring>
#define CHECK(x) do { cudaError_t e = (x); if (e) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

__global__ void scale(cudaTextureObject_t in, cudaSurfaceObject_t out, int w, int h, float by) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < w && y < h) surf2Dwrite(tex2D<float>(in, x + 0.5f, y + 0.5f) * by, out, x * 4, y);
}

__global__ void pitched(cudaTextureObject_t in, float *out, int w, int h) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < w && y < h) out[y * w + x] = tex2D<float>(in, x, y) + 1.0f;
}

__global__ void volume(cudaTextureObject_t in, float *out, int n) {
    int x = threadIdx.x, y = threadIdx.y, z = threadIdx.z;
    out[(z * n + y) * n + x] = tex3D<float>(in, x + 0.5f, y + 0.5f, z + 0.5f);
}

static double sum(const float *p, size_t n) { double s = 0; for (size_t i = 0; i < n; i++) s += p[i] * (i % 7 + 1); return s; }

int main() {
    const int W = 64, H = 32, HP = 80;  // the host image's rows are 80 floats apart
    static float image[H][HP], back[H][W];
    for (int y = 0; y < H; y++) for (int x = 0; x < HP; x++) image[y][x] = (float)(y * 100 + x);
    cudaChannelFormatDesc f = cudaCreateChannelDesc<float>();
    cudaArray_t src, dst;
    CHECK(cudaMallocArray(&src, &f, W, H));
    CHECK(cudaMallocArray(&dst, &f, W, H, cudaArraySurfaceLoadStore));
    CHECK(cudaMemcpy2DToArray(src, 0, 0, image, HP * 4, W * 4, H, cudaMemcpyHostToDevice));
    cudaResourceDesc res = {};
    res.resType = cudaResourceTypeArray;
    res.res.array.array = src;
    cudaTextureDesc td = {};
    td.filterMode = cudaFilterModePoint;
    td.readMode = cudaReadModeElementType;
    cudaTextureObject_t tex;
    CHECK(cudaCreateTextureObject(&tex, &res, &td, nullptr));
    res.res.array.array = dst;
    cudaSurfaceObject_t surf;
    CHECK(cudaCreateSurfaceObject(&surf, &res));
    scale<<<dim3(W / 16, H / 16), dim3(16, 16)>>>(tex, surf, W, H, 3.0f);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy2DFromArray(back, W * 4, dst, 0, 0, W * 4, H, cudaMemcpyDeviceToHost));
    printf("surface write: back[0][0]=%g back[31][63]=%g weighted sum=%.1f\n", back[0][0],
           back[31][63], sum(&back[0][0], W * H));
    // an array to array copy and a sub-rectangle out of it
    float part[4][5];
    CHECK(cudaMemcpy2DArrayToArray(src, 0, 0, dst, 0, 0, W * 4, H));
    CHECK(cudaMemcpy2DFromArray(part, 5 * 4, src, 8 * 4, 3, 5 * 4, 4, cudaMemcpyDeviceToHost));
    printf("array to array: part[0][0]=%g part[3][4]=%g\n", part[0][0], part[3][4]);
    CHECK(cudaDestroySurfaceObject(surf));
    CHECK(cudaDestroyTextureObject(tex));

    // a texture over pitched linear memory (cudaMallocPitch)
    float *lin, *out;
    size_t pitch;
    CHECK(cudaMallocPitch((void **)&lin, &pitch, W * 4, H));
    CHECK(cudaMemcpy2D(lin, pitch, image, HP * 4, W * 4, H, cudaMemcpyHostToDevice));
    CHECK(cudaMalloc(&out, W * H * 4));
    cudaResourceDesc pr = {};
    pr.resType = cudaResourceTypePitch2D;
    pr.res.pitch2D.devPtr = lin;
    pr.res.pitch2D.desc = f;
    pr.res.pitch2D.width = W;
    pr.res.pitch2D.height = H;
    pr.res.pitch2D.pitchInBytes = pitch;
    CHECK(cudaCreateTextureObject(&tex, &pr, &td, nullptr));
    pitched<<<dim3(W / 16, H / 16), dim3(16, 16)>>>(tex, out, W, H);
    CHECK(cudaMemcpy(back, out, W * H * 4, cudaMemcpyDeviceToHost));
    printf("pitch2D texture: back[5][7]=%g weighted sum=%.1f\n", back[5][7], sum(&back[0][0], W * H));
    CHECK(cudaDestroyTextureObject(tex));

    // a 3D array by cudaMemcpy3D, read through tex3D
    const int N = 8;
    static float vol[N][N][N], got[N * N * N];
    for (int i = 0; i < N * N * N; i++) (&vol[0][0][0])[i] = (float)(i % 97);
    cudaArray_t a3;
    CHECK(cudaMalloc3DArray(&a3, &f, make_cudaExtent(N, N, N)));
    cudaMemcpy3DParms p = {};
    p.srcPtr = make_cudaPitchedPtr(vol, N * 4, N, N);
    p.dstArray = a3;
    p.extent = make_cudaExtent(N, N, N);
    p.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&p));
    res = {};
    res.resType = cudaResourceTypeArray;
    res.res.array.array = a3;
    CHECK(cudaCreateTextureObject(&tex, &res, &td, nullptr));
    volume<<<1, dim3(N, N, N)>>>(tex, out, N);
    CHECK(cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost));
    printf("3D texture: same=%d\n", !memcmp(got, vol, sizeof got));
    cudaExtent extent;
    cudaChannelFormatDesc fd;
    unsigned flags;
    CHECK(cudaArrayGetInfo(&fd, &extent, &flags, a3));
    printf("array info: %zux%zux%zu x=%d f=%d\n", extent.width, extent.height, extent.depth, fd.x,
           (int)fd.f);
    CHECK(cudaDestroyTextureObject(tex));
    CHECK(cudaFreeArray(a3)); CHECK(cudaFreeArray(src)); CHECK(cudaFreeArray(dst));
    CHECK(cudaFree(lin)); CHECK(cudaFree(out));
    printf("done\n");
    return 0;
}
