/* Part 4: DDP, FSDP (ZeRO-3, chapter 2's driver) and Megatron TP (chapter 3's) on the
 * same links, slowed down as the ladder's Ethernet is. The course text: FSDP runs well
 * on NVLink and drags on ordinary Ethernet; TP needs NVLink. FSDP moves 1.5x DDP's
 * bytes in 3 messages per block and step; TP's 4 all-reduces per block carry
 * activations and sit on the critical path, so every one of them pays the latency.
 *
 * The reference of all three is the same ranks computing the same batch with no
 * communication at all (DDP with its all-reduce off, no wire): every strategy does
 * the model's FLOPs once over the ranks. Each strategy runs with no wire (its own
 * copies, and on fewer cores than ranks the waiting for a peer's compute), then on
 * each link; efficiency = reference ms / ms on the link. The prediction adds, to the
 * reference, the run's measured messages (sequential steps of its collectives) x
 * alpha + its bytes sent per rank / beta, with no overlap. */
#include "communication.h"

#include <stdio.h>
#include <string.h>

#include "compare.h"
#include "ddp.h"
#include "mesh.h"
#include "stage_run.h"
#include "tensor_parallel.h"

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
    ddp_job job = {.cfg = cfg, .data = data, .opts = ddp_options_default()};
    job.opts.allreduce = allreduce;
    int status = launch(&cfg->comm, ddp_rank_main, &job);
    if (!status)
        *out = (strategy_figures){run_ms_per_step(&job.result), run_comm_fraction(&job.result),
                                  (double)job.allreduce_calls *
                                      ring_steps(COMM_KIND_ALLREDUCE, cfg->comm.ranks),
                                  job.result.bytes_sent_per_step};
    ddp_job_release(&job);
    return status;
}

static int run_fsdp(const run_config *cfg, const dataset *data, strategy_figures *out) {
    zero_options opts = {.stage = 3};
    stage_outcome o;
    int status = stage_run_launch(cfg, data, &opts, &o);
    if (!status) {
        double messages = 0;
        for (int k = 0; k < COMM_NKINDS; k++)
            messages += o.comm_calls[k] * ring_steps(k, cfg->comm.ranks);
        *out = (strategy_figures){run_ms_per_step(&o.result), run_comm_fraction(&o.result),
                                  messages, o.result.bytes_sent_per_step};
    }
    stage_outcome_free(&o);
    return status;
}

typedef struct {
    const run_config *cfg;
    const dataset *data;
    const baseline_run *baseline;
    int tp;
    strategy_figures *out;
} tp_args;

static int tp_main(comm *world, void *argp) {
    tp_args *a = argp;
    mesh m;
    mesh_create(&m, world, (mesh_shape){.tp = a->tp, .pp = 1, .dp = comm_size(world) / a->tp});
    tp_train_run run;
    tp_train(world, &m, a->cfg, NULL, a->data, a->baseline, &run);
    if (comm_rank(world) == 0)
        *a->out = (strategy_figures){run_ms_per_step(&run.result),
                                     run_comm_fraction(&run.result),
                                     run.allreduces_per_step *
                                         ring_steps(COMM_KIND_ALLREDUCE, a->tp),
                                     run.bytes_tp_per_step + run.bytes_dp_per_step};
    tp_train_run_free(&run);
    mesh_free(&m);
    return 0;
}

/* The largest TP size that divides the heads and the ranks (chapter 3's rule). */
static int tp_size(const run_config *cfg) {
    char err[256];
    for (int t = cfg->comm.ranks; t > 1; t--)
        if (tp_check_sizes(cfg, cfg->comm.ranks, t, err, sizeof err)) return t;
    return 1;
}

static int run_tp(const run_config *cfg, const dataset *data, const baseline_run *baseline,
                  strategy_figures *out) {
    tp_args a = {cfg, data, baseline, tp_size(cfg), out};
    return launch(&cfg->comm, tp_main, &a);
}

static int run_strategy(int s, const run_config *c, const dataset *data,
                        const baseline_run *baseline, int repeats, strategy_figures *out) {
    int status = 0;
    for (int k = 0; k < repeats && !status; k++) {
        strategy_figures f = {0};
        status = s < 0   ? run_ddp(c, data, 0, &f)   /* the reference */
               : s == 0 ? run_ddp(c, data, 1, &f)
               : s == 1 ? run_fsdp(c, data, &f)
                        : run_tp(c, data, baseline, &f);
        if (!status && (k == 0 || f.ms_per_step < out->ms_per_step)) *out = f;
    }
    return status;
}

int on_links_run(const run_config *cfg, const dataset *data, double link_scale, int repeats,
                 link_strategy_row rows[LINK_STRATEGIES]) {
    static const char *names[LINK_STRATEGIES] = {"ddp", "fsdp", "tp"};
    run_config quiet = on_wire(cfg, LINK_NONE, 1);
    baseline_run *baseline = baseline_train(&quiet, data);   /* TP compares with it */
    strategy_figures ideal = {0};
    int status = run_strategy(-1, &quiet, data, baseline, repeats, &ideal);
    for (int s = 0; s < LINK_STRATEGIES && !status; s++) {
        memset(&rows[s], 0, sizeof rows[s]);
        rows[s].strategy = names[s];
        rows[s].ideal_ms = ideal.ms_per_step;
        for (int w = 0; w <= LINKS && !status; w++) {
            run_config c = on_wire(cfg, wires[w], link_scale);
            strategy_figures f = {0};
            status = run_strategy(s, &c, data, baseline, repeats, &f);
            rows[s].ms_per_step[w] = f.ms_per_step;
            rows[s].comm_fraction[w] = f.comm_fraction;
            rows[s].efficiency[w] = f.ms_per_step > 0 ? ideal.ms_per_step / f.ms_per_step : 0;
            if (w == 0) {
                rows[s].messages_per_step = f.messages;
                rows[s].bytes_per_step = f.bytes;
            }
        }
    }
    baseline_free(baseline);
    return status;
}

double on_links_predicted_efficiency(const link_strategy_row *row, plan_link link) {
    const double compute = 1e-3 * row->ideal_ms;
    const double wire = row->messages_per_step * link.latency +
                        (link.bandwidth > 0 ? row->bytes_per_step / link.bandwidth : 0);
    return compute > 0 ? compute / (compute + wire) : 0;
}

void on_links_print(const link_strategy_row rows[LINK_STRATEGIES], double link_scale) {
    static const char *link_names[LINKS + 1] = {"no wire", "nvlink", "ib", "ethernet"};
    char size[32];
    printf("\nDDP, FSDP (ZeRO-3) and TP on each link (slowed %.3gx): ms/step, comm %%,"
           " efficiency measured (predicted)\n  against the same ranks computing with no"
           " communication: %.1f ms/step\n", link_scale, rows[0].ideal_ms);
    printf("  strategy  messages/st  sent/rank/st");
    for (int w = 0; w <= LINKS; w++) printf(" %24s", link_names[w]);
    printf("\n");
    for (int s = 0; s < LINK_STRATEGIES; s++) {
        const link_strategy_row *r = &rows[s];
        printf("  %-8s %12.0f %13s", r->strategy, r->messages_per_step,
               report_bytes(r->bytes_per_step, size));
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
