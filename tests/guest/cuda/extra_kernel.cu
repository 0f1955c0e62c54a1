// The kernel extra_launch.cu loads: parameters of mixed sizes and alignments.
extern "C" __global__ void fill(int *out, int base, char tag, double step, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = base + tag * 1000 + (int)(i * step);
}
