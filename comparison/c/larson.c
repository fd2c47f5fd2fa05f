/* larson: mimalloc-bench's `larson` (bench/larson, Larson & Krishnan's server simulation), run
 * as `larson 5 8 1000 5000 100 4141 T`: blocks of 8 to 999 bytes, 5000 blocks per thread, 100
 * rounds, seed 4141, T threads.
 *
 * Main allocates T x 5000 blocks, shuffles them, replaces 4 x T x 5000 at random and hands
 * each thread slot 5000 of them. A slot runs 100 generations (x scale): each a fresh thread
 * that takes over the slot's blocks and replaces a random one 100 x 5000 times (writing its
 * first two bytes and checking them when it frees it), so every generation frees what the
 * previous one, or main, allocated. The original runs for 5 s and reports throughput; this
 * one does a fixed amount of work and is timed.
 */
#include "common.h"

enum { CHUNKS = 5000, ROUNDS = 100 };

struct slot {
    unsigned char *blocks[CHUNKS];
    size_t sizes[CHUNKS];
    rng_t rng;
    uint64_t ops;
};

static size_t generations;

static void replace(unsigned char **b, size_t *size, rng_t *rng) {
    if (*b) {
        if ((*b)[0] != 'a' || (*b)[1] != 'b') fail("larson: a block was corrupted");
        free(*b);
    }
    *size = rng_range(rng, 8, 999);
    *b = xmalloc(*size);
    (*b)[0] = 'a';
    (*b)[1] = 'b';
}

/* One generation: a thread of its own. */
static void *generation(void *p) {
    struct slot *s = p;
    for (size_t i = 0; i < (size_t)ROUNDS * CHUNKS; i++) {
        size_t v = rng_range(&s->rng, 0, CHUNKS - 1);
        replace(&s->blocks[v], &s->sizes[v], &s->rng);
        s->ops++;
    }
    return NULL;
}

static uint64_t slot_main(int tid, void *ctx) {
    struct slot *s = &((struct slot *)ctx)[tid];
    s->rng = rng_new((uint64_t)tid + 7);
    for (size_t g = 0; g < generations; g++) {
        pthread_t th;
        if (pthread_create(&th, NULL, generation, s)) fail("pthread_create failed");
        pthread_join(th, NULL);
    }
    uint64_t bytes = 0;
    for (int i = 0; i < CHUNKS; i++) {
        bytes += s->sizes[i];
        free(s->blocks[i]);
    }
    return mix(s->ops, bytes);
}

static uint64_t run(int threads, double scale) {
    generations = scaled(100, scale);
    size_t total = (size_t)threads * CHUNKS;
    unsigned char **all = calloc(total, sizeof *all);
    size_t *sizes = calloc(total, sizeof *sizes);
    if (!all || !sizes) fail("out of memory");
    rng_t rng = rng_new(4141);
    for (size_t i = 0; i < total; i++) replace(&all[i], &sizes[i], &rng);
    for (size_t i = total - 1; i > 0; i--) {
        size_t j = rng_range(&rng, 0, i);
        unsigned char *b = all[i];
        size_t z = sizes[i];
        all[i] = all[j], sizes[i] = sizes[j];
        all[j] = b, sizes[j] = z;
    }
    for (size_t i = 0; i < 4 * total; i++) {
        size_t v = rng_range(&rng, 0, total - 1);
        replace(&all[v], &sizes[v], &rng);
    }
    struct slot *slots = calloc((size_t)threads, sizeof *slots);
    if (!slots) fail("out of memory");
    for (size_t i = 0; i < total; i++) {
        slots[i / CHUNKS].blocks[i % CHUNKS] = all[i];
        slots[i / CHUNKS].sizes[i % CHUNKS] = sizes[i];
    }
    free(all);
    free(sizes);
    uint64_t sum = run_threads(threads, slot_main, slots);
    free(slots);
    return sum;
}

int main(int argc, char **argv) { return bench_main(argc, argv, "larson", 1, run); }
