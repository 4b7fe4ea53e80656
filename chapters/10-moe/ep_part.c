/* Part ep: the MoE model on one device (the chapter's baseline), with its experts over
 * every rank (EP = ranks where it divides the experts), and on an EP x DP mesh; each
 * against one device, and the all-to-all bytes each rank sent next to what its routing
 * implies and to the uniform-routing formula. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "moe_chapter.h"

/* The largest EP size that divides both the ranks and the experts. */
static int widest_ep(int ranks, int experts) {
    for (int ep = ranks; ep > 1; ep--)
        if (ranks % ep == 0 && experts % ep == 0) return ep;
    return 1;
}

/* ranks data-parallel ranks, ep of them an EP group (expert-DP ranks / ep). */
static mesh_shape ep_mesh_of(int ranks, int ep) {
    return (mesh_shape){.tp = 1, .pp = 1, .dp = ranks, .cp = 1, .ep = ep};
}

/* The meshes after one device: the widest EP, then an EP x DP mesh when it differs. */
static void choose_meshes(const run_config *cfg, const moe_config *moe, ep_report *r) {
    const int ranks = cfg->comm.ranks, E = moe->experts;
    r->mesh[0] = ep_mesh_of(1, 1);
    r->count = 1;
    if (ranks == 1) return;
    const int wide = widest_ep(ranks, E), mixed = moe_chapter_mesh_ep(ranks, E);
    r->mesh[r->count++] = ep_mesh_of(ranks, wide);
    if (mixed > 1 && mixed != wide) r->mesh[r->count++] = ep_mesh_of(ranks, mixed);
}

/* One run, the mesh trainer's outcome and its extra. */
typedef struct {
    strategy_outcome out;
    mesh_extra x;
} ep_run;

static double largest_difference(const float *a, const float *b, size_t n) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)a[i] - b[i]));
    return worst;
}

/* Against one device: the dense model's vectors, then the routers' and the experts'
 * (gathered over the EP group), one largest difference each over both. */
static void compare_run(ep_run *run, const ep_run *one) {
    const baseline_run base = mesh_outcome_as_baseline(&one->out);
    strategy_outcome_compare(&run->out, &base);
    const size_t n = one->x.moe_num_params;
    run_result *x = &run->out.result;
    x->diff_grads = fmax(x->diff_grads, largest_difference(run->x.moe_first_grads,
                                                           one->x.moe_first_grads, n));
    x->diff_params = fmax(x->diff_params, largest_difference(run->x.moe_final_params,
                                                             one->x.moe_final_params, n));
}

/* The run's numbers, kept after its outcome is freed: the losses copied (--json's); the
 * all-to-all's bytes, its routing's and their mismatch, the largest rank's; the uniform
 * routing's 4 exchanges x N k C 4 B x (EP - 1) / EP a MoE block, N a rank's tokens. */
static void keep_traffic(ep_report *r, int i, const ep_run *run, const moe_config *moe,
                         const run_config *cfg) {
    const strategy_outcome *o = &run->out;
    r->result[i] = o->result;
    const size_t bytes = (size_t)o->result.steps * sizeof(float);
    r->loss[i] = malloc(bytes ? bytes : 1);
    if (!r->loss[i]) abort();
    memcpy(r->loss[i], o->loss, bytes);
    r->result[i].loss = r->loss[i];
    /* the mesh's formula leaves the all-to-alls out (they are held against the routing,
     * a2a B and routed): no formula for sent B, which holds them */
    r->result[i].bytes_formula = -1;
    const int world = mesh_world(&r->mesh[i]), EP = mesh_ep_size(&r->mesh[i]);
    r->alltoall[i] = r->routed[i] = r->remote_fraction[i] = 0;
    for (int w = 0; w < world; w++) {
        const mesh_rank_traffic *t = &run->x.ranks[w];
        r->alltoall[i] = fmax(r->alltoall[i], t->alltoall);
        r->routed[i] = fmax(r->routed[i], t->alltoall_routed);
        r->remote_fraction[i] = fmax(r->remote_fraction[i], t->remote_fraction);
    }
    r->mismatch[i] = run->x.alltoall_mismatch;
    const moe_shape s = moe_shape_make(moe, &cfg->model, 1, 0);
    const double tokens = (double)cfg->batch * cfg->model.ctx / world;
    r->uniform[i] = 4.0 * s.moe_layers * tokens * moe->top_k * s.dim * sizeof(float) *
                    (EP - 1) / EP;
}

static void ep_run_free(ep_run *run) {
    if (run->out.loss) strategy_outcome_free(&run->out);
    mesh_extra_free(&run->x);
}

/* The bounds in the run's precision (chapter 11's): every EP run's dp is the ranks, so
 * one set holds them all. */
static int set_tolerances(const run_config *cfg, const dataset *data, const moe_config *moe,
                          const ep_run *one, mesh_shape shape, ep_report *r) {
    const baseline_run base = mesh_outcome_as_baseline(&one->out);
    r->tol = mesh_run_tolerances(cfg, shape, moe, &base);
    const pipeline_options o = moe_chapter_pipeline(moe, "moe");
    const double from_fp32 = mesh_loss_bound_from_fp32(cfg, data, &o, one->out.loss);
    if (from_fp32 > r->tol.loss) r->tol.loss = r->loss_from_fp32 = from_fp32;
    return from_fp32 < 0;
}

int ep_launches(const run_config *cfg, const dataset *data, const moe_config *moe,
                ep_report *r) {
    memset(r, 0, sizeof *r);
    choose_meshes(cfg, moe, r);
    ep_run runs[EP_RUNS];
    memset(runs, 0, sizeof runs);   /* a run never started frees nothing */
    int status = 0;
    for (int i = 1; i < r->count && !status; i++) {   /* the collective runs first */
        run_config c = *cfg;
        if (i > 1) c.comm.trace_path = NULL;           /* --trace: the first EP run's */
        const pipeline_options o = moe_chapter_pipeline(moe, "ep");
        runs[i].out.extra = &runs[i].x;
        status = mesh_launch(&c, data, r->mesh[i], &o, &runs[i].out);
    }
    if (!status && process_hosts_rank0())
        status = moe_chapter_one_device(cfg, data, moe, cfg->steps, &runs[0].out, &runs[0].x);
    if (!status && process_hosts_rank0()) {
        keep_traffic(r, 0, &runs[0], moe, cfg);
        r->result[0].diff_loss = r->result[0].diff_grads = r->result[0].diff_params = 0;
        const moe_routing_log *log = &runs[0].x.moe_log;
        const int blocks = moe_shape_make(moe, &cfg->model, 1, 0).moe_layers;
        for (int s = 0; s < cfg->steps * blocks; s++) {
            r->dropped += log->dropped[s];
            for (int e = 0; e < moe->experts; e++)
                r->pairs += log->load[(size_t)s * moe->experts + e];
        }
        if (r->count > 1) status = set_tolerances(cfg, data, moe, &runs[0], r->mesh[1], r);
        for (int i = 1; i < r->count; i++) {
            compare_run(&runs[i], &runs[0]);
            keep_traffic(r, i, &runs[i], moe, cfg);
            r->worst_fraction =
                fmax(r->worst_fraction, run_worst_fraction_of(&runs[i].out.result, r->tol));
        }
    }
    for (int i = 0; i < r->count; i++) ep_run_free(&runs[i]);
    return status;
}

void ep_report_free(ep_report *r) {
    for (int i = 0; i < EP_RUNS; i++) free(r->loss[i]);
    memset(r->loss, 0, sizeof r->loss);
}

int ep_report_agrees(const ep_report *r) {
    double worst = 0;
    for (int i = 0; i < r->count; i++) worst = fmax(worst, r->mismatch[i]);
    return r->worst_fraction <= 1 && worst == 0;
}

static const char *mesh_label(const ep_report *r, int i, char buf[32]) {
    if (i == 0) return "one device";
    snprintf(buf, 32, "ep %d x dp %d", r->mesh[i].ep, mesh_expert_dp_size(&r->mesh[i]));
    return buf;
}

void ep_print(const ep_report *r, const moe_config *moe) {
    printf("\nExpert parallelism against one device (%d experts, top-%d, capacity factor %g,"
           " aux %g): %.0f of %.0f pairs dropped on one device\n", moe->experts, moe->top_k,
           moe->capacity_factor, moe->aux_coef, r->dropped, r->pairs);
    printf("  %-12s %8s %8s %8s %7s %5s %10s %10s %10s %10s %7s\n", "run", "d loss",
           "d grads", "d params", "tok/s", "comm", "sent B", "a2a B", "routed", "uniform",
           "remote");
    for (int i = 0; i < r->count; i++) {
        char label[32];
        const run_result *x = &r->result[i];
        printf("  %-12s %8.1e %8.1e %8.1e %7.0f %4.0f%% %10.0f %10.0f %10.0f %10.0f %6.0f%%\n",
               mesh_label(r, i, label), x->diff_loss, x->diff_grads, x->diff_params,
               run_tokens_per_second(x), 100 * run_comm_fraction(x), x->bytes_sent_per_step,
               r->alltoall[i], r->routed[i], r->uniform[i], 100 * r->remote_fraction[i]);
    }
    printf("  (bytes per rank per step, largest rank: sent on every group, and on the EP group"
           " alone)\n");
    if (r->count == 1) {
        printf("  one rank: no expert-parallel run to compare (try ./run 2 or more)\n");
        return;
    }
    char loss[80];
    if (r->tol.loss > 0) snprintf(loss, sizeof loss, "%.1e", r->tol.loss);
    else snprintf(loss, sizeof loss, "not held past %d steps in fp32 (routing flips: tolerances.h)",
                  TOL_STEPS);
    printf("  tolerances: loss %s%s, grads %.1e, params %.1e; the worst difference is %.2g of"
           " its tolerance: %s\n", loss,
           r->loss_from_fp32 > 0 ? " (2 x one device's distance from fp32: tolerances.h)" : "",
           r->tol.grads, r->tol.params, r->worst_fraction,
           r->worst_fraction <= 1 ? "every EP run is the one-device run" : "MISMATCH");
    double worst = 0;
    for (int i = 0; i < r->count; i++) worst = fmax(worst, r->mismatch[i]);
    printf("  all-to-all bytes: measured on the EP group = 4 exchanges x rows sent to other"
           " ranks x C x 4 B + the counts, on every rank (worst mismatch %.0f B)\n", worst);
}

void ep_json(FILE *o, const ep_report *r) {
    fprintf(o, "\"ep_runs\": [");
    for (int i = 0; i < r->count; i++) {
        const run_result *x = &r->result[i];
        fprintf(o, "%s{\"ep\": %d, \"dp\": %d, \"diff_vs_one_device\": {\"loss\": %.3g,"
                " \"grads\": %.3g, \"params\": %.3g}, \"tokens_per_s\": %.1f,"
                " \"comm_fraction\": %.4f, \"bytes_sent_per_rank_per_step\": %.0f,"
                " \"alltoall_bytes_per_rank_per_step\": %.0f, \"alltoall_routed_bytes\": %.0f,"
                " \"alltoall_uniform_bytes\": %.0f, \"remote_fraction\": %.4f}",
                i ? ", " : "", r->mesh[i].ep, mesh_expert_dp_size(&r->mesh[i]), x->diff_loss, x->diff_grads,
                x->diff_params, run_tokens_per_second(x),
                run_comm_fraction(x), x->bytes_sent_per_step, r->alltoall[i], r->routed[i],
                r->uniform[i], r->remote_fraction[i]);
    }
    fprintf(o, "], \"ep_worst_fraction_of_tolerance\": %.4g, \"dropped_pairs\": %.0f,"
            " \"routed_pairs\": %.0f", r->worst_fraction, r->dropped, r->pairs);
}
