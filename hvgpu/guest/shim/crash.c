/* Where a program crashed, when HVGPU_SHIM_TRACE is set.
 *
 * Libraries built on CUDA call the driver through tables and entry points the
 * shim may answer differently from NVIDIA's driver, and a crash there shows up
 * in the program as a bare segmentation fault. With tracing on, the shim
 * installs a handler for the fatal signals that writes the faulting address
 * and the native stack (with the library each frame is in) to stderr, then
 * hands the signal to whatever handler was there before (Python's faulthandler,
 * a debugger's, or the default action), so the program dies as it would have.
 *
 * Must not change anything when tracing is off, and must not call anything in
 * the handler that is not safe there beyond backtrace(), which is preloaded.
 */
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shim.h"

static const int SIGNALS[] = { SIGSEGV, SIGBUS, SIGILL, SIGFPE };
static struct sigaction previous[sizeof SIGNALS / sizeof *SIGNALS];

static void say(const char *s) {
    ssize_t ignored = write(2, s, strlen(s));
    (void)ignored;
}

static void on_fatal(int sig, siginfo_t *info, void *uc) {
    (void)uc;
    char line[160];
    snprintf(line, sizeof line, "hvgpu: fatal signal %d (%s) at address %p; native stack:\n",
             sig, strsignal(sig), info ? info->si_addr : NULL);
    say(line);
    void *frames[48];
    int n = backtrace(frames, 48);
    backtrace_symbols_fd(frames, n, 2);
    for (size_t i = 0; i < sizeof SIGNALS / sizeof *SIGNALS; i++) {
        if (SIGNALS[i] == sig) {
            sigaction(sig, &previous[i], NULL);
            break;
        }
    }
    /* Returning re-runs the faulting instruction under the previous handler; a signal
       someone raised on purpose is raised again for it. */
    if (info && info->si_code <= 0) raise(sig);
}

__attribute__((constructor)) static void install(void) {
    if (!hv_trace_enabled()) return;
    void *warm[1];
    backtrace(warm, 1); /* loads libgcc_s now, not inside the handler */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fatal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof SIGNALS / sizeof *SIGNALS; i++)
        sigaction(SIGNALS[i], &sa, &previous[i]);
}
