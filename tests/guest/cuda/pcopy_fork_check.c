/* Drives the shim's parallel copy (pcopy.c, linked in alone) across fork(): the parent
 * copies once (its helpers start, and serve that job), then forks; each child poisons
 * the parent's last destination, copies something else, and checks that the poisoned
 * buffer was left alone. Prints "stale=N" (children whose old destination was written).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

void hv_copy(void *dst, const void *src, size_t n);

#define N (8u << 20)

int main(int argc, char **argv) {
    int children = argc > 1 ? atoi(argv[1]) : 20;
    unsigned char *a = malloc(N), *s = malloc(N), *b = malloc(N), *c = malloc(N);
    if (!a || !s || !b || !c) return 2;
    memset(s, 0x11, N);
    hv_copy(a, s, N); /* the parent's last job: a <- s */
    int stale = 0;
    for (int k = 0; k < children; k++) {
        pid_t pid = fork();
        if (pid < 0) return 2;
        if (pid == 0) {
            memset(a, 0xEE, N); /* a is no copy's destination any more */
            memset(c, 0x22, N);
            hv_copy(b, c, N);
            for (size_t i = 0; i < N; i++)
                if (a[i] != 0xEE) _exit(1);
            for (size_t i = 0; i < N; i++)
                if (b[i] != 0x22) _exit(3);
            _exit(0);
        }
        int status;
        if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status)) return 2;
        if (WEXITSTATUS(status) == 3) return 3;
        stale += WEXITSTATUS(status) == 1;
    }
    printf("stale=%d\n", stale);
    return 0;
}
