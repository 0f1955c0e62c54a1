/* Allocates, waits for a line on stdin (the test stops the agent meanwhile),
 * then allocates again: the second call must fail with a CUDA error. */
#include <stdio.h>
#include <stddef.h>
int cuInit(unsigned flags);
int cuMemAlloc_v2(unsigned long long *dptr, size_t size);
int cuGetErrorName(int error, const char **name);
int main(void) {
    unsigned long long p;
    const char *name = "?";
    int r = cuInit(0);
    if (!r) r = cuMemAlloc_v2(&p, 1 << 20);
    printf("first: %d\n", r);
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 2;
    r = cuMemAlloc_v2(&p, 1 << 20);
    cuGetErrorName(r, &name);
    printf("second: %d %s\n", r, name);
    return 0;
}
