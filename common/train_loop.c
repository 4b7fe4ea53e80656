#include "train_loop.h"

#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "compare.h"
#include "op_profile.h"
#include "ops.h"

/* a - b, kind by kind: the strategy's traffic without the loop's own */
static comm_stats stats_minus(comm_stats a, const comm_stats *b) {
    for (int k = 0; k < COMM_NKINDS; k++) {
        a.calls[k] -= b->calls[k];
        a.bytes_sent[k] -= b->bytes_sent[k];
        a.bytes_received[k] -= b->bytes_received[k];
        a.seconds[k] -= b->seconds[k];
    }
    a.async_seconds -= b->async_seconds;
    a.hidden_seconds -= b->hidden_seconds;
    return a;
}

static void fill_comm(run_result *r, comm *world, comm *metrics) {
    if (!world) return;
    const comm_stats metrics_stats = comm_stats_get(metrics);
    const comm_stats s = stats_minus(comm_stats_all(world), &metrics_stats);
    r->comm_seconds = comm_stats_total_seconds(&s);
    r->hidden_seconds = s.hidden_seconds;
    r->bytes_sent_per_step =
        r->timed_steps > 0 ? (double)comm_stats_total_sent(&s) / r->timed_steps : 0;
}

void train_loop(comm *world, const run_config *cfg, double tokens_per_step,
                const train_strategy *st, train_outcome *out) {
    const int steps = cfg->steps;
    const int reports = !world || comm_world_rank(world) == 0;
    comm *metrics = world ? comm_split(world, 0, comm_rank(world), "metrics") : NULL;
    memset(out, 0, sizeof *out);
    out->loss = calloc((size_t)steps, sizeof(float));
    out->step_seconds = calloc((size_t)steps, sizeof(double));
    mem_stats *mem = mem_stats_current();
    double timed = 0;
    int timed_steps = 0;
    op_profile *profile = cfg->profile ? calloc(1, sizeof *profile) : NULL;
    if (profile) op_profile_start(profile);
    for (int step = 1; step <= steps; step++) {
        double start = comm_now();
        float loss = st->compute_grads(st->ctx, step);
        double seconds = comm_now() - start;
        if (step == 1 && st->keep_first_grads) st->keep_first_grads(st->ctx);
        start = comm_now();
        st->update(st->ctx, step);
        ops_synchronize();
        seconds += comm_now() - start;

        if (metrics) comm_allreduce(metrics, &loss, 1, COMM_F32, COMM_SUM);
        out->loss[step - 1] = loss;
        out->step_seconds[step - 1] = seconds;
        if (reports) report_step(cfg, st->name, step, loss, seconds, tokens_per_step);
        if (step > 1 || steps == 1) {
            timed += seconds;
            timed_steps++;
        }
        if (step == 1 && steps > 1) {
            if (st->after_warmup) st->after_warmup(st->ctx);
            if (world) comm_stats_reset(world);
            mem_stats_reset_peaks(mem);
            if (profile) op_profile_clear(profile);
        }
    }
    if (profile) op_profile_stop(profile);
    run_result *r = &out->result;
    *r = (run_result){.strategy = st->name, .steps = steps, .loss = out->loss,
                      .diff_loss = -1, .diff_grads = -1, .diff_params = -1,
                      .seconds = timed, .timed_steps = timed_steps,
                      .tokens_per_step = tokens_per_step, .bytes_formula = -1,
                      .memory = *mem};
    fill_comm(r, world, metrics);
    if (profile)   /* --json keeps stdout one JSON object */
        r->sgemm_floor_seconds =
            op_profile_report(profile, metrics, st->name, timed_steps, timed,
                              r->comm_seconds, cfg->json ? stderr : stdout);
    free(profile);
    if (metrics) run_result_take_max(metrics, r);
    comm_free(metrics);
}

void train_outcome_free(train_outcome *out) {
    free(out->loss);
    free(out->step_seconds);
    memset(out, 0, sizeof *out);
}
