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
static void choose_meshes(const run_config *cfg, const ep_options *opts, ep_report *r) {
    const int ranks = cfg->comm.ranks, E = opts->moe.experts;
    r->mesh[0] = ep_mesh_of(1, 1);
    r->count = 1;
    if (ranks == 1) return;
    const int wide = widest_ep(ranks, E), mixed = moe_chapter_mesh_ep(ranks, E);
    r->mesh[r->count++] = ep_mesh_of(ranks, wide);
    if (mixed > 1 && mixed != wide) r->mesh[r->count++] = ep_mesh_of(ranks, mixed);
}

/* The run's numbers, kept after its outcome is freed: the losses copied (--json's). */
static void keep_traffic(ep_report *r, int i, const ep_outcome *o) {
    r->result[i] = o->result;
    const size_t bytes = (size_t)o->result.steps * sizeof(float);
    r->loss[i] = malloc(bytes ? bytes : 1);
    if (!r->loss[i]) abort();
    memcpy(r->loss[i], o->loss, bytes);
    r->result[i].loss = r->loss[i];
    r->alltoall[i] = o->alltoall_bytes;
    r->routed[i] = o->alltoall_routed_bytes;
    r->uniform[i] = o->alltoall_uniform_bytes;
    r->mismatch[i] = o->alltoall_worst_mismatch;
    r->remote_fraction[i] = o->remote_fraction;
}

int ep_launches(const run_config *cfg, const dataset *data, const ep_options *opts,
                ep_report *r) {
    memset(r, 0, sizeof *r);
    choose_meshes(cfg, opts, r);
    ep_outcome runs[EP_RUNS] = {0};   /* a run never started frees nothing */
    int status = 0;
    for (int i = 1; i < r->count && !status; i++) {   /* the collective runs first */
        run_config c = *cfg;
        if (i > 1) c.comm.trace_path = NULL;           /* --trace: the first EP run's */
        ep_options o = *opts;
        o.mesh = r->mesh[i];
        ep_outcome_alloc(&runs[i], &c, &opts->moe);
        status = ep_launch(&c, data, &o, &runs[i]);
    }
    if (!status && process_hosts_rank0()) {
        run_config single = *cfg;
        single.comm.ranks = 1;
        single.comm.trace_path = NULL;
        ep_outcome_alloc(&runs[0], &single, &opts->moe);
        ep_train_single(&single, data, opts, &runs[0]);
        const baseline_run base = ep_outcome_as_baseline(&runs[0]);
        keep_traffic(r, 0, &runs[0]);
        r->result[0].diff_loss = r->result[0].diff_grads = r->result[0].diff_params = 0;
        const int blocks = runs[0].shape.moe_layers, E = opts->moe.experts;
        for (int s = 0; s < cfg->steps * blocks; s++) {
            r->dropped += runs[0].dropped[s];
            for (int e = 0; e < E; e++) r->pairs += runs[0].load[(size_t)s * E + e];
        }
        for (int i = 1; i < r->count; i++) {
            compare_to_baseline(&runs[i].result, &base, runs[i].loss, runs[i].first_grads,
                                runs[i].final_params);
            keep_traffic(r, i, &runs[i]);
            r->worst_fraction = fmax(r->worst_fraction, run_worst_fraction_of_tolerance(
                &runs[i].result, EP_TOL_GRADS, EP_TOL_LOSS, EP_TOL_PARAMS));
        }
        ep_outcome_free(&runs[0]);
    }
    for (int i = 1; i < r->count; i++) ep_outcome_free(&runs[i]);
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
    printf("  tolerances: loss %.0e, grads %.0e, params %.0e; the worst difference is %.2g of"
           " its tolerance: %s\n", EP_TOL_LOSS, EP_TOL_GRADS, EP_TOL_PARAMS, r->worst_fraction,
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
