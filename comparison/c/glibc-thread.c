/* glibc-thread: mimalloc-bench's `glibc-thread` (bench/glibc-bench/bench-malloc-thread.c,
 * glibc's threaded malloc benchmark), run as `glibc-thread T`: T threads, a working set of
 * 1024 blocks each, 4 to 32768 bytes with an inverse-square distribution, seed 88.
 *
 * Two tables are drawn once (8000 block sizes, 4096 working-set offsets) and every thread
 * walks them from the start: free the block at the next offset, allocate one of the next size
 * in its place and write every byte of it. The original runs for 2 s and reports the
 * iterations; this one runs 20 million iterations per thread (x scale) and is timed.
 */
#include "common.h"

enum { WORKING_SET = 1024, SIZES = 8000, OFFSETS = 4 * WORKING_SET };
enum { MIN_SIZE = 4, MAX_SIZE = 32768 };

static unsigned sizes[SIZES], offsets[OFFSETS];
static size_t iters;

/* Inverse square on [MIN_SIZE, MAX_SIZE]: x = 1 / (1/min + u (1/max - 1/min)). */
static unsigned block_size(rng_t *r) {
    double u = (double)(rng_next(r) >> 11) / (double)(1ull << 53);
    return (unsigned)(1.0 / (1.0 / MIN_SIZE + u * (1.0 / MAX_SIZE - 1.0 / MIN_SIZE)));
}

static uint64_t worker(int tid, void *ctx) {
    (void)tid, (void)ctx;
    unsigned char *set[WORKING_SET] = { 0 };
    unsigned set_size[WORKING_SET] = { 0 };
    uint64_t sum = 0;
    for (size_t i = 0; i < iters; i++) {
        unsigned at = offsets[i % OFFSETS], size = sizes[i % SIZES];
        if (set[at]) {
            unsigned last = set_size[at] - 1;
            if (set[at][last] != (unsigned char)last) fail("glibc-thread: a block was corrupted");
            sum += set_size[at];
            free(set[at]);
        }
        unsigned char *p = set[at] = xmalloc(size);
        set_size[at] = size;
        for (unsigned b = 0; b < size; b++) p[b] = (unsigned char)b;
    }
    for (int i = 0; i < WORKING_SET; i++) {
        sum += set_size[i];
        free(set[i]);
    }
    return sum;
}

static uint64_t run(int threads, double scale) {
    iters = scaled(20000000, scale);
    rng_t r = rng_new(88);
    for (int i = 0; i < SIZES; i++) sizes[i] = block_size(&r);
    for (int i = 0; i < OFFSETS; i++) offsets[i] = (unsigned)(rng_next(&r) % WORKING_SET);
    return run_threads(threads, worker, NULL);
}

int main(int argc, char **argv) { return bench_main(argc, argv, "glibc-thread", 1, run); }
