/* Calls through slot 3 of a table it was never given: the crash the shim's trace
   must locate (fault address 0x18) without keeping the program alive. */
#include <stddef.h>

typedef int (*slot)(void);
extern int cuInit(unsigned flags);

int main(void) {
    cuInit(0); /* loads and initialises the shim; no agent is needed for this */
    slot *volatile table = NULL;
    return table[3]();
}
