/* cache-scratch: mimalloc-bench's `cache-scratch` (bench/cache-scratch, from Hoard: passive
 * false sharing), run as `cache-scratch 1 1000 1 2000000 P` and `cache-scratch P 1000 1
 * 2000000 P`: T threads, 1000 iterations, 1-byte objects, 2,000,000 writes (x scale) split
 * over the threads.
 *
 * Main first allocates one 1-byte object per thread (adjacent, likely on one cache line) and
 * each thread starts by freeing "its" object; then, 1000 times, it allocates a 1-byte object,
 * writes and reads it 2,000,000 / T times and frees it. An allocator that hands the freed
 * bytes back to the threads makes them write to one cache line.
 */
#include "common.h"

static size_t reps;

static uint64_t worker(int tid, void *ctx) {
    free(((char **)ctx)[tid]);
    uint64_t count = 0;
    for (int i = 0; i < 1000; i++) {
        volatile char *o = xmalloc(1);
        for (size_t r = 0; r < reps; r++) {
            *o = 0;
            count += (uint64_t)*o + 1;
        }
        free((void *)o);
    }
    return count;
}

static uint64_t run(int threads, double scale) {
    reps = scaled(2000000, scale) / (size_t)threads;
    char **given = xmalloc(sizeof(char *) * (size_t)threads);
    for (int t = 0; t < threads; t++) {
        given[t] = xmalloc(1);
        *given[t] = 1;
    }
    uint64_t sum = run_threads(threads, worker, given);
    free(given);
    return sum;
}

int main(int argc, char **argv) { return bench_main(argc, argv, "cache-scratch", 1, run); }
