/* A C RDMA program on librdma_pool: every buffer it posts comes from malloc, with the keys
 * rdma_pool_keys_of gives; it never calls ibv_reg_mr. Two RC QPs of the pool's PD on the
 * pool's device are connected to each other (loopback): a SEND/RECV between malloc'ed
 * buffers; a grant of one buffer to the peer, which READs it with the grant's key; the grant
 * revoked, and the same READ with its key refused; a READ with the pool's own rkey of a
 * buffer nobody granted, refused.
 *
 * Exit status: 0 when all of that held; 3 when the pool is on no verbs device (the soft NIC:
 * no ibv objects to post on — the host's test checks that answer); 1 otherwise. Arguments are
 * ignored (the rxe bed passes a test harness's). Statically linked with librdma_pool.a in CI. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "rdma_pool.h"

#define FAIL(...)                                                                        \
    do {                                                                                 \
        fprintf(stderr, "rdma_app: " __VA_ARGS__);                                       \
        fprintf(stderr, " (errno %d: %s; rdma_pool: %s)\n", errno, strerror(errno),     \
                rdma_pool_last_error());                                                 \
        exit(1);                                                                         \
    } while (0)

static struct ibv_cq *cq;

/* The next completion of the application (the pool's own are handed to it), or exit. */
static struct ibv_wc next_wc(void) {
    struct ibv_wc wc;
    time_t end = time(NULL) + 10;
    for (;;) {
        int n = ibv_poll_cq(cq, 1, &wc);
        if (n < 0) FAIL("ibv_poll_cq");
        if (n == 1 && !rdma_pool_on_completion(&wc)) return wc;
        if (n == 0 && time(NULL) > end) FAIL("no completion in 10 s");
    }
}

/* Poll (handing the pool its completions) until the grant is in `want`. */
static void wait_grant(struct rdma_pool_grant *g, int want) {
    time_t end = time(NULL) + 10;
    int s;
    while ((s = rdma_pool_grant_state(g)) != want) {
        if (s < 0) { errno = -s; FAIL("grant failed"); }
        struct ibv_wc wc;
        int n = ibv_poll_cq(cq, 1, &wc);
        if (n == 1 && !rdma_pool_on_completion(&wc))
            FAIL("unexpected application completion %llu", (unsigned long long)wc.wr_id);
        if (time(NULL) > end) FAIL("grant stuck in state %d, wanted %d", s, want);
    }
}

static struct ibv_qp *make_qp(struct ibv_pd *pd) {
    struct ibv_qp_init_attr a = {
        .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
        .cap = {.max_send_wr = 32, .max_recv_wr = 32, .max_send_sge = 1, .max_recv_sge = 1},
    };
    struct ibv_qp *qp = ibv_create_qp(pd, &a);
    if (!qp) FAIL("ibv_create_qp");
    return qp;
}

/* Connect `qp` to the QP numbered `remote` on this same port (RoCE: GID 1, else 0). */
static void connect_qp(struct ibv_qp *qp, uint32_t remote, union ibv_gid *gid) {
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1,
                            .qp_access_flags = IBV_ACCESS_REMOTE_READ |
                                               IBV_ACCESS_REMOTE_WRITE |
                                               IBV_ACCESS_REMOTE_ATOMIC};
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                  IBV_QP_ACCESS_FLAGS))
        FAIL("to INIT");
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = remote;
    a.max_dest_rd_atomic = 4;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = *gid;
    a.ah_attr.grh.sgid_index = 0;
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                  IBV_QP_MIN_RNR_TIMER))
        FAIL("to RTR");
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 4;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
        FAIL("to RTS");
}

static struct ibv_sge sge_of(void *p, size_t n) {
    uint32_t lkey, rkey;
    int rc = rdma_pool_keys_of(p, n, &lkey, &rkey);
    if (rc) { errno = rc; FAIL("rdma_pool_keys_of(%p, %zu)", p, n); }
    return (struct ibv_sge){.addr = (uintptr_t)p, .length = (uint32_t)n, .lkey = lkey};
}

/* The peer READs `n` bytes at `addr` with `rkey` into `dst` through `qp`: the status. */
static enum ibv_wc_status peer_read(struct ibv_qp *qp, void *dst, uint64_t addr, uint32_t rkey,
                                    size_t n) {
    struct ibv_sge s = sge_of(dst, n);
    struct ibv_send_wr wr = {.wr_id = 77, .sg_list = &s, .num_sge = 1,
                             .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED,
                             .wr.rdma = {.remote_addr = addr, .rkey = rkey}}, *bad;
    if (ibv_post_send(qp, &wr, &bad)) FAIL("post READ");
    struct ibv_wc wc = next_wc();
    if (wc.wr_id != 77) FAIL("READ completion expected, got %llu", (unsigned long long)wc.wr_id);
    return wc.status;
}

int main(void) {
    struct ibv_context *ctx = rdma_pool_context();
    struct ibv_pd *pd = rdma_pool_pd();
    if (!ctx || !pd) {
        printf("rdma_app: no verbs device (errno %d): %s\n", errno, rdma_pool_last_error());
        return 3;
    }
    cq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
    if (!cq) FAIL("ibv_create_cq");
    union ibv_gid gid;
    if (ibv_query_gid(ctx, 1, 0, &gid)) FAIL("ibv_query_gid");
    struct ibv_qp *server = make_qp(pd), *client = make_qp(pd);
    connect_qp(server, client->qp_num, &gid);
    connect_qp(client, server->qp_num, &gid);

    /* SEND/RECV between malloc'ed buffers */
    size_t n = 64 * 1024;
    char *msg = malloc(n), *in = calloc(1, n);
    for (size_t i = 0; i < n; i++) msg[i] = (char)(i * 7);
    struct ibv_sge rs = sge_of(in, n), ss = sge_of(msg, n);
    struct ibv_recv_wr rwr = {.wr_id = 1, .sg_list = &rs, .num_sge = 1}, *rbad;
    struct ibv_send_wr swr = {.wr_id = 2, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
                              .send_flags = IBV_SEND_SIGNALED}, *sbad;
    if (ibv_post_recv(client, &rwr, &rbad)) FAIL("post_recv");
    if (ibv_post_send(server, &swr, &sbad)) FAIL("post_send");
    for (int i = 0; i < 2; i++) {
        struct ibv_wc wc = next_wc();
        if (wc.status != IBV_WC_SUCCESS) FAIL("SEND/RECV %llu: %s", (unsigned long long)wc.wr_id,
                                              ibv_wc_status_str(wc.status));
    }
    if (memcmp(msg, in, n)) FAIL("the message arrived damaged");

    /* a grant of 4 KiB of one buffer to the client's end */
    char *shared = malloc(8192), *secret = malloc(4096), *dst = malloc(4096);
    memset(shared, 'g', 8192);
    memset(secret, 's', 4096);
    struct rdma_pool_grant *g;
    struct rdma_pool_wire w;
    int rc = rdma_pool_grant(server, shared, 4096, IBV_ACCESS_REMOTE_READ, &g, &w);
    if (rc) { errno = rc; FAIL("rdma_pool_grant"); }
    wait_grant(g, 1);
    if (w.addr != (uintptr_t)shared || w.len != 4096) FAIL("wire triple");
    enum ibv_wc_status st = peer_read(client, dst, w.addr, w.rkey, 4096);
    if (st != IBV_WC_SUCCESS) FAIL("granted READ: %s", ibv_wc_status_str(st));
    if (memcmp(dst, shared, 4096)) FAIL("granted READ read other bytes");

    /* revoke: the same READ is refused */
    if ((rc = rdma_pool_revoke(g))) { errno = rc; FAIL("rdma_pool_revoke"); }
    wait_grant(g, 2);
    memset(dst, 0, 4096);
    st = peer_read(client, dst, w.addr, w.rkey, 4096);
    if (st == IBV_WC_SUCCESS) FAIL("a revoked key still READ");
    printf("rdma_app: revoked key refused: %s\n", ibv_wc_status_str(st));
    rdma_pool_grant_free(g);

    /* the pool's own rkey grants nothing: a READ of a buffer nobody granted is refused (on a
     * fresh pair: a refused READ leaves its QPs in error) */
    struct ibv_qp *s2 = make_qp(pd), *c2 = make_qp(pd);
    connect_qp(s2, c2->qp_num, &gid);
    connect_qp(c2, s2->qp_num, &gid);
    uint32_t lkey, pool_rkey;
    if (rdma_pool_keys_of(secret, 4096, &lkey, &pool_rkey)) FAIL("keys of secret");
    st = peer_read(c2, dst, (uintptr_t)secret, pool_rkey, 4096);
    if (st == IBV_WC_SUCCESS || dst[0] == 's') FAIL("the pool's rkey READ an ungranted buffer");
    printf("rdma_app: the pool's own rkey refused: %s\n", ibv_wc_status_str(st));

    struct rdma_pool_stats s;
    rdma_pool_stats(&s);
    printf("rdma_app: ok: SEND/RECV of %zu B and a granted READ on malloc'ed memory, no "
           "ibv_reg_mr; %llu MRs, %llu grants issued, %llu open\n",
           n, (unsigned long long)s.memory_regions, (unsigned long long)s.grants_issued,
           (unsigned long long)s.grants_open);
    return 0;
}
