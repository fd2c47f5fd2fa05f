/* glibc-simple: mimalloc-bench's `glibc-simple` (bench/glibc-bench/bench-malloc-simple.c,
 * glibc's malloc benchmark), run without arguments: blocks of 16, 32 and 64 bytes, batches
 * of 25, 100, 400 and 1600 blocks, 2,000,000 blocks (x scale) per batch size.
 *
 * For each block size and batch size, 2,000,000 / batch times: allocate a batch of blocks,
 * fill each with its int indices, free them all. That runs four times per block size: a
 * warm-up and single-threaded on main, then on a second thread, then on main again (the
 * original times glibc's main arena against a thread arena). One thread at a time.
 */
#include "common.h"

enum { BATCHES = 4, MAX_BATCH = 1600 };
static const int batch[BATCHES] = { 25, 100, 400, MAX_BATCH };

struct bench { size_t size, iters; int **arr; uint64_t sum; };

static void do_benchmark(struct bench *b, int n) {
    size_t ints = b->size / sizeof(int);
    for (size_t j = 0; j < b->iters / (size_t)n; j++) {
        for (int i = 0; i < n; i++) {
            b->arr[i] = xmalloc(b->size);
            for (size_t g = 0; g < ints; g++) b->arr[i][g] = (int)g;
        }
        for (int i = 0; i < n; i++) {
            b->sum += (uint64_t)b->arr[i][ints - 1];
            free(b->arr[i]);
        }
    }
}

static void *on_thread(void *p) {
    for (int i = 0; i < BATCHES; i++) do_benchmark(p, batch[i]);
    return NULL;
}

static uint64_t bench(size_t size, size_t iters) {
    struct bench b = { size, iters, xmalloc(MAX_BATCH * sizeof(int *)), 0 };
    for (int round = 0; round < 2; round++) /* the warm-up, then on main */
        for (int i = 0; i < BATCHES; i++) do_benchmark(&b, batch[i]);
    pthread_t th;
    if (pthread_create(&th, NULL, on_thread, &b)) fail("pthread_create failed");
    pthread_join(th, NULL);
    for (int i = 0; i < BATCHES; i++) do_benchmark(&b, batch[i]);
    free(b.arr);
    return b.sum;
}

static uint64_t run(int threads, double scale) {
    (void)threads;
    size_t iters = scaled(2000000, scale);
    uint64_t sum = 0;
    for (size_t size = 16; size <= 64; size *= 2) sum = mix(sum, bench(size, iters));
    return sum;
}

int main(int argc, char **argv) { return bench_main(argc, argv, "glibc-simple", 0, run); }
