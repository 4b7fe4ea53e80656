/* Part 1: the three wires of the course text, their ratios computed from the figures,
 * and what one DDP all-reduce of this model's gradients costs on each: measured on the
 * modelled wire (scale 1) and predicted by the ring's alpha-beta formula. */
#include "communication.h"

#include <stdio.h>

#include "report.h"

static const comm_link link_order[LINKS] = {LINK_NVLINK, LINK_IB, LINK_ETHERNET};
static const char *const link_names[LINKS] = {"nvlink", "ib", "ethernet"};

int links_measure(const run_config *cfg, size_t gradient_bytes, link_row rows[LINKS]) {
    const int ranks = cfg->comm.ranks;
    for (int i = 0; i < LINKS; i++) {
        const plan_link link = plan_link_of(link_order[i]);
        comm_options wire = cfg->comm;
        wire.link = link_order[i];
        wire.link_scale = 1;
        rows[i] = (link_row){.link = link_order[i], .bandwidth = link.bandwidth,
                             .latency = link.latency,
                             .predicted_s = plan_allreduce_seconds(link, ranks,
                                                                   (double)gradient_bytes)};
        int status = measure_allreduces(&wire, ALLREDUCE_RING, ranks, &gradient_bytes, 1,
                                        &rows[i].measured_s);
        if (status) return status;
    }
    return 0;
}

void links_print(const link_row rows[LINKS], int ranks, size_t gradient_bytes) {
    char size[32];
    printf("\nThe links (course text: NVLink 900 GB/s, InfiniBand 400 Gb/s, Ethernet 25 Gb/s;"
           " latencies ours)\n");
    printf("  link        bandwidth    latency   ring all-reduce of %s on %d ranks:"
           " measured   predicted\n", report_bytes((double)gradient_bytes, size), ranks);
    for (int i = 0; i < LINKS; i++)
        printf("  %-9s %8.3f GB/s %7.0f us %36.3f ms %8.3f ms\n", link_names[i],
               rows[i].bandwidth / 1e9, rows[i].latency * 1e6, 1e3 * rows[i].measured_s,
               1e3 * rows[i].predicted_s);
    printf("  bandwidth ratios: nvlink/ib %.1fx, ib/ethernet %.1fx, nvlink/ethernet %.0fx;"
           " latency ratio ethernet/nvlink %.0fx\n",
           rows[0].bandwidth / rows[1].bandwidth, rows[1].bandwidth / rows[2].bandwidth,
           rows[0].bandwidth / rows[2].bandwidth, rows[2].latency / rows[0].latency);
    printf("  (measured includes this CPU's copies and thread wake-ups, which the wire model"
           " does not: on the\n  fast links they are most of the time)\n");
}
