/* Why the course says TP needs NVLink: the wire time of TP's all-reduces on the
 * course's three links, next to the compute they interrupt, for this run and for one
 * GPT-3 layer. Arithmetic, not measurement: a ring all-reduce of B bytes over t ranks
 * is 2(t-1) messages of B/t bytes, each paying the link's latency and bandwidth. */
#include <stdio.h>

#include "tensor_parallel.h"

/* The course's links (NVLink, IB, Ethernet) as the threads backend models them. */
static const comm_link links[] = {LINK_NVLINK, LINK_IB, LINK_ETHERNET};

static double allreduce_seconds(comm_link link, double bytes, int t) {
    const comm_link_figures l = comm_link_spec(link);
    if (t < 2) return 0.0;
    return 2.0 * (t - 1) * (l.latency + bytes / t / l.bandwidth);
}

/* Wire time on each link of `count` all-reduces of `bytes`, plus two of the loss's
 * per-token numbers (N and 2N floats) when loss_tokens > 0. */
static void print_row(const char *what, double compute_s, int count, double bytes,
                      double loss_tokens, int t) {
    printf("  %-24s %9.2f ms", what, 1e3 * compute_s);
    for (int i = 0; i < 3; i++) {
        double s = count * allreduce_seconds(links[i], bytes, t);
        if (loss_tokens > 0)
            s += allreduce_seconds(links[i], 4.0 * loss_tokens, t) +
                 allreduce_seconds(links[i], 8.0 * loss_tokens, t);
        printf(" %16.2f ms", 1e3 * s);
    }
    printf("\n");
}

void print_link_projection(const run_config *cfg, int t, int B_local,
                           double compute_ms_per_step) {
    const gpt_config *m = &cfg->model;
    const double N = (double)B_local * m->ctx;
    printf("\nwhy TP needs NVLink: TP's all-reduces on the course's links (ring: 2(t-1)"
           " messages each)\n  %-24s %12s", "", "compute");
    for (int i = 0; i < 3; i++) printf(" %19s", comm_link_spec(links[i]).title);
    printf("\n");
    /* this run: (4L + 2) all-reduces of B T C floats, and the loss's */
    print_row("this run, one step", 1e-3 * compute_ms_per_step, 4 * m->layers + 2,
              4.0 * N * m->dim, N, t);
    /* one GPT-3 layer (C = 12288) on one 2048-token sequence, TP = 8, bf16, on H100s
     * at half of the 989 TFLOP/s dense peak: 4 all-reduces of T x C x 2 bytes */
    const double C = 12288, T = 2048, tp = 8;
    const double flops = (72.0 * C * C * T + 12.0 * T * T * C) / tp;
    print_row("GPT-3 layer, TP 8, H100", flops / (0.5 * 989e12), 4, 2.0 * T * C, 0, (int)tp);
    printf("  (compute: this run's measured, without its communication; GPT-3: fwd + bwd of"
           " 2048 tokens in bf16 at half the H100's peak)\n");
}
