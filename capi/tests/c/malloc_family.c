/* The whole malloc family of librdma_pool.so, run linked and under LD_PRELOAD (the rdma_pool_*
 * functions are weak here: under LD_PRELOAD they resolve to the preloaded library). Every
 * block must be registered: rdma_pool_keys_of answers 0 for all of it. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "rdma_pool.h"

/* realloc failing leaves the block to the caller, which frees it: not a use after free. */
#pragma GCC diagnostic ignored "-Wuse-after-free"

#pragma weak rdma_pool_keys_of
#pragma weak rdma_pool_stats

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);
/* C23; glibc before 2.43 lacks them, so they are weak: the library's. */
extern void free_sized(void *, size_t) __attribute__((weak));
extern void free_aligned_sized(void *, size_t, size_t) __attribute__((weak));
/* Sizes the compiler must not see through (it warns about impossible requests). */
static volatile size_t half = SIZE_MAX / 2, huge = SIZE_MAX - 8, petabyte = (size_t)1 << 50;

static int failures;
#define CHECK(c)                                                                      \
    do {                                                                              \
        if (!(c)) {                                                                   \
            fprintf(stderr, "%s:%d: CHECK(%s) failed (errno %d)\n", __FILE__, __LINE__, #c, \
                    errno);                                                           \
            failures++;                                                               \
        }                                                                             \
    } while (0)

static void registered(const void *p, size_t n) {
    uint32_t l, r;
    int rc = rdma_pool_keys_of(p, n, &l, &r);
    if (rc != 0)
        fprintf(stderr, "keys_of(%p, %zu) = %d\n", p, n, rc);
    CHECK(rc == 0);
}

static void fill_check(unsigned char *p, size_t n, unsigned char v) {
    memset(p, v, n);
    for (size_t i = 0; i < n; i += 97)
        CHECK(p[i] == v);
}

int main(void) {
    CHECK(free_sized != NULL && free_aligned_sized != NULL);
    CHECK(rdma_pool_keys_of != NULL); /* the library is loaded (linked or preloaded) */
    if (rdma_pool_keys_of == NULL)
        return 1;
    static const size_t sizes[] = {0, 1, 7, 8, 15, 16, 17, 24, 48, 64, 100, 1000, 4096, 4097,
                                   65536, 100000, 262144, 1 << 20, (1 << 20) + 1, 5 << 20,
                                   64 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        size_t n = sizes[i];
        unsigned char *p = malloc(n);
        CHECK(p != NULL);
        CHECK((uintptr_t)p % 16 == 0);
        CHECK(malloc_usable_size(p) >= n);
        if (n) {
            fill_check(p, n, 0xAB);
            registered(p, n);
        }
        /* grow, keep the bytes; shrink, keep them */
        unsigned char *q = realloc(p, n * 3 + 10);
        CHECK(q != NULL && (uintptr_t)q % 16 == 0);
        for (size_t k = 0; k < n; k += 61)
            CHECK(q[k] == 0xAB);
        registered(q, n * 3 + 10);
        unsigned char *s = realloc(q, n / 2 + 1);
        CHECK(s != NULL);
        for (size_t k = 0; k < n / 2 + 1 && k < n; k += 61)
            CHECK(s[k] == 0xAB);
        free(s);

        unsigned char *z = calloc(n + 1, 3);
        CHECK(z != NULL);
        for (size_t k = 0; k < (n + 1) * 3; k++)
            if (z[k]) {
                CHECK(z[k] == 0);
                break;
            }
        free(z);
    }
    /* alignments: posix_memalign, aligned_alloc, memalign, valloc, pvalloc */
    long page = sysconf(_SC_PAGESIZE);
    for (size_t a = sizeof(void *); a <= (4u << 20); a *= 2) {
        size_t n = a / 2 + 3;
        void *p = NULL;
        CHECK(posix_memalign(&p, a, n) == 0);
        CHECK(p && (uintptr_t)p % a == 0);
        CHECK(malloc_usable_size(p) >= n);
        fill_check(p, n, 1);
        registered(p, n);
        free(p);
        p = aligned_alloc(a, a * 2);
        CHECK(p && (uintptr_t)p % a == 0);
        free_aligned_sized(p, a, a * 2);
        p = memalign(a, 10);
        CHECK(p && (uintptr_t)p % a == 0);
        free(p);
    }
    void *m = memalign(48, 100); /* not a power of two: rounded up to 64 (glibc) */
    CHECK(m && (uintptr_t)m % 64 == 0);
    free(m);
    void *v = valloc(100);
    CHECK(v && (uintptr_t)v % page == 0);
    free(v);
    v = pvalloc(100);
    CHECK(v && (uintptr_t)v % page == 0 && malloc_usable_size(v) >= (size_t)page);
    free(v);

    /* errors set errno as POSIX says */
    void *p = NULL;
    CHECK(posix_memalign(&p, 3, 10) == EINVAL);
    CHECK(posix_memalign(&p, 4, 10) == EINVAL); /* not a multiple of sizeof(void *) */
    errno = 0;
    CHECK(aligned_alloc(24, 48) == NULL && errno == EINVAL);
    errno = 0;
    CHECK(calloc(half, 3) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(malloc(huge) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(reallocarray(NULL, half, 3) == NULL && errno == ENOMEM);
    /* more than the machine's memory and swap: refused, not reserved for the OOM killer */
    errno = 0;
    CHECK(malloc(petabyte) == NULL && errno == ENOMEM);
    CHECK(posix_memalign(&p, 4096, petabyte) == ENOMEM);
    p = malloc(10);
    errno = 0;
    void *same = realloc(p, huge);
    CHECK(same == NULL && errno == ENOMEM); /* p is untouched */
    errno = 1234; /* free preserves errno */
    free(p);
    CHECK(errno == 1234);
    free(NULL);
    CHECK(realloc(NULL, 10) != NULL); /* leaks 10 bytes on purpose: a malloc */
    p = malloc(10);
    CHECK(realloc(p, 0) == NULL); /* frees (glibc) */
    p = reallocarray(NULL, 10, 10);
    CHECK(p && malloc_usable_size(p) >= 100);
    free_sized(p, 100);
    CHECK(malloc_usable_size(NULL) == 0);

    /* glibc's own entry points */
    p = __libc_malloc(50);
    CHECK(p);
    registered(p, 50);
    __libc_free(p);
    p = __libc_memalign(256, 50);
    CHECK(p && (uintptr_t)p % 256 == 0);
    __libc_free(p);

    /* the harmless ones */
    CHECK(mallopt(M_ARENA_MAX, 2) == 1);
    struct mallinfo2 mi = mallinfo2();
    void *big = malloc(1 << 20);
    struct mallinfo2 mi2 = mallinfo2();
    CHECK(mi2.uordblks >= mi.uordblks + (1 << 20));
    free(big);
    (void)malloc_trim(0);

    /* memory that is not the pool's */
    int on_stack = 0;
    uint32_t l, r;
    CHECK(rdma_pool_keys_of(&on_stack, 4, &l, &r) == ENOENT);
    CHECK(rdma_pool_keys_of(NULL, 4, &l, &r) == EINVAL);
    char *blk = malloc(100);
    CHECK(rdma_pool_keys_of(blk, 0, &l, &r) == EINVAL);
    CHECK(rdma_pool_keys_of(blk, half, &l, &r) == ERANGE);
    free(blk);

    struct rdma_pool_stats st;
    CHECK(rdma_pool_stats(&st) == 0);
    CHECK(st.state == 2);
    CHECK(st.allocated_bytes > 0 && st.registered_bytes > 0);
    CHECK(st.degraded_allocations == 0);
    printf("malloc_family: %s (%d failures); degraded %llu, bootstrap %llu, foreign frees %llu\n",
           failures ? "FAILED" : "ok", failures, (unsigned long long)st.degraded_allocations,
           (unsigned long long)st.bootstrap_blocks, (unsigned long long)st.foreign_frees);
    return failures ? 1 : 0;
}
