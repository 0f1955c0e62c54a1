/* A host that answers with empty bodies: the library must not read what it was not sent. */
#include <stdio.h>
typedef struct nvml_dev *nvmlDevice_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
int nvmlInit_v2(void);
int nvmlDeviceGetHandleByIndex_v2(unsigned, nvmlDevice_t *);
int nvmlDeviceGetUtilizationRates(nvmlDevice_t, nvmlUtilization_t *);
int nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t *);
int nvmlSystemGetCudaDriverVersion(int *);
int nvmlDeviceGetCudaComputeCapability(nvmlDevice_t, int *, int *);
int main(void) {
    if (nvmlInit_v2()) { puts("init failed"); return 2; }
    nvmlDevice_t h = 0;
    int r = nvmlDeviceGetHandleByIndex_v2(0, &h);
    printf("handle %d\n", r);
    nvmlUtilization_t u = {0};
    r = nvmlDeviceGetUtilizationRates(h, &u);
    printf("util r=%d gpu=%u\n", r, u.gpu);
    nvmlMemory_t m = {0};
    r = nvmlDeviceGetMemoryInfo(h, &m);
    printf("mem r=%d total=%llu used=%llu\n", r, m.total, m.used);
    int v = 0;
    r = nvmlSystemGetCudaDriverVersion(&v);
    printf("driver r=%d v=%d\n", r, v);
    int a = 0, b = 0;
    r = nvmlDeviceGetCudaComputeCapability(h, &a, &b);
    printf("cc r=%d %d.%d\n", r, a, b);
    return 0;
}
