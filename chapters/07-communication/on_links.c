/* Part 4: DDP, FSDP (ZeRO-3) and Megatron TP, the library's strategies, on the
 * same links, slowed down as the ladder's Ethernet is. The course text: FSDP runs well
 * on NVLink and drags on ordinary Ethernet; TP needs NVLink. FSDP moves 1.5x DDP's
 * bytes in 3 messages per block and step; TP's 4 all-reduces per block carry
 * activations and sit on the critical path, so every one of them pays the latency.
 *
 * Each strategy runs with no wire (its own copies, and on fewer cores than ranks the
 * waiting for a peer's compute), then on each link, round after round, so that a burst
 * of load from other programs falls on all wires alike; the fastest of each is kept.
 * A strategy's reference is its own fastest run on any wire: the wire only adds time,
 * so that is the best measure of the strategy without it, and efficiency = reference
 * ms / ms on the link is at most 1 by construction. (Not DDP with its all-reduce off,
 * run once beforehand: load from other programs during that one run, and FSDP's and
 * TP's AdamW over their own shard alone, put runs at 121-180% of it.) The prediction
 * adds, to the reference, the run's measured messages (sequential steps of its
 * collectives) x alpha + its bytes sent per rank / beta, with no overlap. */
#include "communication.h"

#include <stdio.h>
#include <string.h>

#include "compare.h"
#include "ddp.h"
#include "tp_train.h"
#include "zero_train.h"

static const comm_link wires[LINKS + 1] = {LINK_NONE, LINK_NVLINK, LINK_IB, LINK_ETHERNET};

/* Steps one rank takes in turn for a ring collective of `kind` on n ranks. */
static double ring_steps(int kind, int n) {
    switch (kind) {
    case COMM_KIND_ALLREDUCE: return 2.0 * (n - 1);
    case COMM_KIND_REDUCE_SCATTER:
    case COMM_KIND_ALLGATHER: return n - 1;
    case COMM_KIND_BROADCAST:
    case COMM_KIND_REDUCE: return n - 1;   /* along the chain */
    default: return 1;
    }
}

typedef struct {
    double ms_per_step, comm_fraction, messages, bytes;
} strategy_figures;

static run_config on_wire(const run_config *cfg, comm_link link, double scale) {
    run_config c = *cfg;
    c.comm.link = link;
    c.comm.link_scale = scale;
    c.comm.trace_path = NULL;
    c.quiet = 1;
    return c;
}

static int run_ddp(const run_config *cfg, const dataset *data, int allreduce,
                   strategy_figures *out) {
    ddp_options opts = ddp_options_default();
    opts.allreduce = allreduce;
    ddp_extra x;
    strategy_outcome o = {.extra = &x};
    int status = ddp_launch(cfg, data, &opts, &o);
    if (!status)
        *out = (strategy_figures){run_ms_per_step(&o.result), run_comm_fraction(&o.result),
                                  (double)x.allreduce_calls *
                                      ring_steps(COMM_KIND_ALLREDUCE, cfg->comm.ranks),
                                  o.result.bytes_sent_per_step};
    strategy_outcome_free(&o);
    ddp_extra_free(&x);
    return status;
}

static int run_fsdp(const run_config *cfg, const dataset *data, strategy_figures *out) {
    zero_options opts = {.stage = 3};
    strategy_outcome o = {0};
    int status = zero_launch(cfg, data, &opts, &o);
    if (!status) {
        double messages = 0;
        for (int k = 0; k < COMM_NKINDS; k++)
            messages += o.comm_calls[k] * ring_steps(k, cfg->comm.ranks);
        *out = (strategy_figures){run_ms_per_step(&o.result), run_comm_fraction(&o.result),
                                  messages, o.result.bytes_sent_per_step};
    }
    strategy_outcome_free(&o);
    return status;
}

static int run_tp(const run_config *cfg, const dataset *data, strategy_figures *out) {
    const int t = tp_largest_size(cfg);   /* divides the heads and the ranks */
    tp_extra x;
    strategy_outcome o = {.extra = &x};
    int status = tp_launch(cfg, data, t, NULL, &o);
    if (!status)
        *out = (strategy_figures){run_ms_per_step(&o.result), run_comm_fraction(&o.result),
                                  x.allreduces_per_step * ring_steps(COMM_KIND_ALLREDUCE, t),
                                  x.bytes_tp_per_step + x.bytes_dp_per_step};
    strategy_outcome_free(&o);
    return status;
}

/* One run: s < 0 is the context line's DDP with its all-reduce off, no wire. */
static int run_strategy(int s, const run_config *c, const dataset *data,
                        strategy_figures *out) {
    return s < 0   ? run_ddp(c, data, 0, out)
         : s == 0 ? run_ddp(c, data, 1, out)
         : s == 1 ? run_fsdp(c, data, out)
                  : run_tp(c, data, out);
}

/* `repeats` rounds over the wires, the fastest of each kept. */
static int run_on_wires(int s, const run_config *cfg, const dataset *data,
                        double link_scale, int repeats,
                        strategy_figures best[LINKS + 1]) {
    for (int k = 0; k < repeats; k++)
        for (int w = 0; w <= LINKS; w++) {
            run_config c = on_wire(cfg, wires[w], link_scale);
            strategy_figures f = {0};
            int status = run_strategy(s, &c, data, &f);
            if (status) return status;
            if (k == 0 || f.ms_per_step < best[w].ms_per_step) best[w] = f;
        }
    return 0;
}

/* A row from its runs: the reference is the fastest of them (see the top). */
static void fill_row(link_strategy_row *row, const char *name, const strategy_figures *best,
                     double compute_alone_ms) {
    memset(row, 0, sizeof *row);
    row->strategy = name;
    row->compute_alone_ms = compute_alone_ms;
    row->ideal_ms = best[0].ms_per_step;
    for (int w = 1; w <= LINKS; w++)
        if (best[w].ms_per_step < row->ideal_ms) row->ideal_ms = best[w].ms_per_step;
    for (int w = 0; w <= LINKS; w++) {
        row->ms_per_step[w] = best[w].ms_per_step;
        row->comm_fraction[w] = best[w].comm_fraction;
        row->efficiency[w] = best[w].ms_per_step > 0 ? row->ideal_ms / best[w].ms_per_step : 0;
    }
    row->messages_per_step = best[0].messages;
    row->bytes_per_step = best[0].bytes;
}

int on_links_run(const run_config *cfg, const dataset *data, double link_scale, int repeats,
                 link_strategy_row rows[LINK_STRATEGIES]) {
    static const char *names[LINK_STRATEGIES] = {"ddp", "fsdp", "tp"};
    run_config quiet = on_wire(cfg, LINK_NONE, 1);
    strategy_figures alone = {0}, f = {0};
    int status = 0;
    for (int k = 0; k < repeats && !status; k++)   /* for scale: computing alone */
        if (!(status = run_strategy(-1, &quiet, data, &f)) &&
            (k == 0 || f.ms_per_step < alone.ms_per_step))
            alone = f;
    for (int s = 0; s < LINK_STRATEGIES && !status; s++) {
        strategy_figures best[LINKS + 1] = {{0}};
        status = run_on_wires(s, cfg, data, link_scale, repeats, best);
        if (!status) fill_row(&rows[s], names[s], best, alone.ms_per_step);
    }
    return status;
}

double on_links_predicted_efficiency(const link_strategy_row *row, plan_link link) {
    const double compute = 1e-3 * row->ideal_ms;
    const double wire = row->messages_per_step * link.latency +
                        (link.bandwidth > 0 ? row->bytes_per_step / link.bandwidth : 0);
    return compute > 0 ? compute / (compute + wire) : 0;
}

/* Each link's block: ms per step, comm %, efficiency and, on a wire, the prediction. */
static const char block_title[] = "  ms/step comm  eff (pred)";

void on_links_print(const link_strategy_row rows[LINK_STRATEGIES], double link_scale) {
    static const char *link_names[LINKS + 1] = {"no wire", "nvlink", "ib", "ethernet"};
    char size[32];
    printf("\nDDP, FSDP (ZeRO-3) and TP on each link (slowed %.3gx), each against its own"
           " fastest run (ref ms;\n  the wire only adds time). For scale, the same ranks"
           " computing with no communication: %.1f ms/step\n", link_scale,
           rows[0].compute_alone_ms);
    printf("  comm: share of a step blocked in communication; eff: ref ms / ms; (pred):"
           " alpha-beta, not overlapped\n");
    printf("%45s", "");
    for (int w = 0; w <= LINKS; w++) printf("%*s%*s", w ? 27 : 20, link_names[w], w ? 0 : 7, "");
    printf("\n  strategy  messages/st  sent/rank/st  ref ms");
    for (int w = 0; w <= LINKS; w++) printf(" %-26.*s", w ? 26 : 19, block_title);
    printf("\n");
    for (int s = 0; s < LINK_STRATEGIES; s++) {
        const link_strategy_row *r = &rows[s];
        printf("  %-8s %12.0f %13s %7.1f", r->strategy, r->messages_per_step,
               report_bytes(r->bytes_per_step, size), r->ideal_ms);
        printf(" %6.1f ms %3.0f%% %3.0f%%       ", r->ms_per_step[0], 100 * r->comm_fraction[0],
               100 * r->efficiency[0]);
        for (int w = 1; w <= LINKS; w++) {
            plan_link link = plan_link_scaled(plan_link_of(wires[w]), link_scale);
            printf(" %6.1f ms %3.0f%% %3.0f%% (%3.0f%%)", r->ms_per_step[w],
                   100 * r->comm_fraction[w], 100 * r->efficiency[w],
                   100 * on_links_predicted_efficiency(r, link));
        }
        printf("\n");
    }
}
