// hello_rdma.c: a SEND between two malloc'ed buffers over a loopback pair of RC QPs, with no
// ibv_reg_mr: the keys come from rdma_pool_keys_of.
//   cc hello_rdma.c $(pkg-config --cflags --libs rdma_pool) -o hello_rdma && ./hello_rdma
#include <rdma_pool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct ibv_sge sge(void *p, size_t n) {
    uint32_t lkey, rkey;
    if (rdma_pool_keys_of(p, n, &lkey, &rkey)) exit(1); // every heap block has keys
    return (struct ibv_sge){.addr = (uintptr_t)p, .length = (uint32_t)n, .lkey = lkey};
}

static void connect_qp(struct ibv_qp *qp, uint32_t peer, union ibv_gid gid) {
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1};
    ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
                             .dest_qp_num = peer, .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
                             .ah_attr = {.is_global = 1, .grh = {.dgid = gid, .hop_limit = 1},
                                         .port_num = 1}};
    ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                              IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
                             .rnr_retry = 7, .max_rd_atomic = 1};
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
        exit(1);
}

int main(void) {
    struct ibv_context *ctx = rdma_pool_context(); // the pool's device...
    struct ibv_pd *pd = rdma_pool_pd();            // ...and protection domain
    if (!pd) {
        printf("no verbs device: %s\n", rdma_pool_last_error());
        return 3;
    }
    struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    struct ibv_qp_init_attr init = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                    .cap = {.max_send_wr = 4, .max_recv_wr = 4,
                                            .max_send_sge = 1, .max_recv_sge = 1}};
    struct ibv_qp *a = ibv_create_qp(pd, &init), *b = ibv_create_qp(pd, &init);
    union ibv_gid gid;
    ibv_query_gid(ctx, 1, 0, &gid);
    connect_qp(a, b->qp_num, gid);
    connect_qp(b, a->qp_num, gid);

    char *msg = strdup("hello from an ordinary malloc'ed buffer"); // registered already
    char *in = calloc(1, 64);
    struct ibv_sge s = sge(msg, strlen(msg) + 1), r = sge(in, 64);
    struct ibv_recv_wr rwr = {.wr_id = 1, .sg_list = &r, .num_sge = 1}, *rbad;
    struct ibv_send_wr swr = {.wr_id = 2, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
                              .send_flags = IBV_SEND_SIGNALED}, *sbad;
    ibv_post_recv(b, &rwr, &rbad);
    ibv_post_send(a, &swr, &sbad);
    for (int done = 0; done < 2;) {
        struct ibv_wc wc;
        if (ibv_poll_cq(cq, 1, &wc) == 1) {
            if (wc.status != IBV_WC_SUCCESS) return 1;
            done++;
        }
    }
    printf("received: %s\n", in);
    return strcmp(in, msg) != 0;
}
