/* xmalloc-test: mimalloc-bench's `xmalloc-test` (bench/xmalloc-test, Lever & Boreham), run as
 * `xmalloc-test -w T -t 5 -s 64`: T producer and T consumer threads, 64-byte objects.
 *
 * Producers allocate batches of 4096 objects of 64 bytes (filling each with i % 256) and push
 * them on one shared stack (at most 100 batches; producers wait while it is full); consumers
 * pop batches, check and free every object, each freed by another thread than the one that
 * allocated it. The original runs for 5 s; this one moves 4000 batches per producer (x scale)
 * and is timed.
 */
#include "common.h"

enum { BATCH = 4096, MAX_QUEUED = 100, OBJ = 64 };

struct batch { struct batch *next; unsigned char *objs[BATCH]; };

static struct {
    pthread_mutex_t lock;
    pthread_cond_t changed;
    struct batch *top;
    int queued, producers;
} stack = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0, 0 };

static size_t per_producer;

static uint64_t producer(void) {
    for (size_t n = 0; n < per_producer; n++) {
        struct batch *b = xmalloc(sizeof *b);
        for (int i = 0; i < BATCH; i++) {
            b->objs[i] = xmalloc(OBJ);
            memset(b->objs[i], i % 256, OBJ);
        }
        pthread_mutex_lock(&stack.lock);
        while (stack.queued >= MAX_QUEUED) pthread_cond_wait(&stack.changed, &stack.lock);
        b->next = stack.top;
        stack.top = b;
        stack.queued++;
        pthread_cond_broadcast(&stack.changed);
        pthread_mutex_unlock(&stack.lock);
    }
    pthread_mutex_lock(&stack.lock);
    stack.producers--;
    pthread_cond_broadcast(&stack.changed);
    pthread_mutex_unlock(&stack.lock);
    return 0;
}

/* Which batches a consumer gets depends on scheduling: the consumers add to one total. */
static uint64_t total;

static uint64_t consumer(void) {
    uint64_t sum = 0;
    for (;;) {
        pthread_mutex_lock(&stack.lock);
        while (!stack.top && stack.producers > 0) pthread_cond_wait(&stack.changed, &stack.lock);
        struct batch *b = stack.top;
        if (b) {
            stack.top = b->next;
            stack.queued--;
            pthread_cond_broadcast(&stack.changed);
        }
        pthread_mutex_unlock(&stack.lock);
        if (!b) {
            __atomic_fetch_add(&total, sum, __ATOMIC_RELAXED);
            return 0;
        }
        for (int i = 0; i < BATCH; i++) {
            unsigned char *o = b->objs[i];
            if (o[0] != i % 256 || o[OBJ - 1] != i % 256)
                fail("xmalloc-test: an object was corrupted");
            sum += (uint64_t)o[0] + o[OBJ - 1];
            free(o);
        }
        free(b);
    }
}

/* Threads 0..T-1 produce, T..2T-1 consume. */
static uint64_t worker(int tid, void *ctx) {
    return tid < (int)(intptr_t)ctx ? producer() : consumer();
}

static uint64_t run(int threads, double scale) {
    per_producer = scaled(4000, scale);
    stack.producers = threads;
    run_threads(2 * threads, worker, (void *)(intptr_t)threads);
    return mix(0, total);
}

int main(int argc, char **argv) { return bench_main(argc, argv, "xmalloc-test", 1, run); }
