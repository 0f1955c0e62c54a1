// Device-side printf, between the host's own lines: what appears, and where.
#include <cstdio>
__global__ void say(int step) {
    printf("kernel step %d thread %d\n", step, (int)threadIdx.x);
}
int main() {
    printf("host: before the first launch\n");
    say<<<1, 2>>>(1);
    cudaDeviceSynchronize();  // the first kernel's lines appear here
    printf("host: after the first synchronisation\n");
    say<<<1, 1>>>(2);
    int *d;
    cudaMalloc(&d, 4);
    int h = 0;
    cudaMemcpy(&h, d, 4, cudaMemcpyDeviceToHost);  // a blocking copy synchronises too
    printf("host: after the copy\n");
    say<<<1, 1>>>(3);
    cudaStreamSynchronize(0);
    printf("host: done, error %d\n", (int)cudaGetLastError());
    return 0;
}
