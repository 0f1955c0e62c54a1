/* Drives the shim's parallel copy (pcopy.c, linked in alone) over the sizes given on
 * the command line: each destination is poisoned, with a guard byte either side,
 * and a fresh pattern is copied into it. Prints one line per size:
 *   SIZE wrong=N guards=ok|spoilt
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void hv_copy(void *dst, const void *src, size_t n);

int main(int argc, char **argv) {
    for (int a = 1; a < argc; a++) {
        size_t n = strtoull(argv[a], NULL, 10);
        unsigned char *src = malloc(n + 1), *dst = malloc(n + 2);
        if (!src || !dst) return 2;
        unsigned x = (unsigned)a * 2654435761u + 7;
        for (size_t i = 0; i < n; i++) { x = x * 1103515245u + 12345u; src[i] = (unsigned char)(x >> 16); }
        for (size_t i = 0; i < n + 2; i++) dst[i] = (unsigned char)~src[i < n ? i : 0];
        unsigned char before = dst[0], after = dst[n + 1];
        hv_copy(dst + 1, src, n);
        size_t wrong = 0;
        for (size_t i = 0; i < n; i++) wrong += dst[i + 1] != src[i];
        printf("%zu wrong=%zu guards=%s\n", n, wrong,
               dst[0] == before && dst[n + 1] == after ? "ok" : "spoilt");
        free(src);
        free(dst);
    }
    return 0;
}
