/* Where the pool sends a worker it moves off its caller's CPU (tests/test_threads.py): threadpool.c's
 * cpus_to_move_to, on masks of a 16-CPU machine, which a 2-CPU machine cannot show in a real move. The file is
 * included whole, as the function is the pool's own (static). Prints "ok", or the first wrong mask and exits 1;
 * "skip" without Linux. */
#include "threadpool.c"

#include <stdio.h>

#if defined(__linux__)
static cpu_set_t cpus(const int* list, int n) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int i = 0; i < n; i++)
        CPU_SET(list[i], &set);
    return set;
}

static int expect(const char* what, const cpu_set_t* allowed, int caller, const int* held, int n,
                  const int* want, int nwant) {
    cpu_set_t got, wanted = cpus(want, nwant);
    cpus_to_move_to(allowed, caller, held, n, &got);
    if (CPU_EQUAL(&got, &wanted))
        return 0;
    printf("%s: got CPUs", what);
    for (int c = 0; c < 64; c++)
        if (CPU_ISSET(c, &got))
            printf(" %d", c);
    printf("\n");
    return 1;
}

int main(void) {
    const int all16[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const cpu_set_t sixteen = cpus(all16, 16);
    int bad = 0;

    /* a team of 16 on 16 CPUs: caller on 3, this worker there too, 14 others on all CPUs but 3 and 9 */
    int held[14], n = 0;
    for (int c = 0; c < 16; c++)
        if (c != 3 && c != 9)
            held[n++] = c;
    bad |= expect("a full team", &sixteen, 3, held, n, (const int[]){9}, 1);

    /* a team of 4: two others awake on 5 and 7, one asleep (-1) */
    const int few[] = {5, -1, 7};
    const int rest[] = {0, 1, 2, 4, 6, 8, 9, 10, 11, 12, 13, 14, 15};
    bad |= expect("a team of 4", &sixteen, 3, few, 3, rest, 13);

    /* the others hold every CPU but the caller's: any but the caller's */
    int every[15];
    for (int c = 0, i = 0; c < 16; c++)
        if (c != 3)
            every[i++] = c;
    bad |= expect("all held", &sixteen, 3, every, 15, every, 15);

    /* a CPU outside the mask, held or not, never becomes a target; 2 CPUs: the other one */
    const int two[] = {0, 1}, other[] = {1}, outside[] = {40, 1};
    const cpu_set_t pair = cpus(two, 2);
    bad |= expect("2 CPUs", &pair, 0, outside, 2, other, 1);
    bad |= expect("2 CPUs, alone", &pair, 0, NULL, 0, other, 1);

    if (!bad)
        printf("ok\n");
    return bad;
}
#else
int main(void) {
    printf("skip: the pool moves workers on Linux only\n");
    return 0;
}
#endif
