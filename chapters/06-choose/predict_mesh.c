/* --predict-chapters' meshes: the planner's search run for bench256 on 8 ranks of one
 * node, its fastest fitting mesh trained by chapter 11 (the same tp, cp, pp, dp shards
 * and replicas, ZeRO stage, micro-batches and precision), then a ZeRO-3 mesh, a ring and a
 * Ulysses CP mesh, a TP + SP mesh and an MoE mesh (this model's MoE count,
 * plan_moe_this_model.h) given to the planner, and the planner's bytes per group
 * (plan_bytes_sent) and memory per GPU (plan_memory_per_gpu) held against what chapter 11
 * measured on the rank that sends or holds the most (predict.h). */
#include "predict.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "plan_cp.h"
#include "plan_moe_this_model.h"
#include "report.h"

/* chapter 11's group kinds, in its --json's order */
static const char *const group_names[PREDICT_MESH_GROUPS] = {
    "tp", "pp", "dp", "embedding", "cp", "dp_replicate", "expert_dp"};
enum { EMBEDDING = 3 };   /* the tied embedding's all-reduce: the planner leaves it out */

plan_request predict_mesh_request(int ranks, precision dtype) {
    plan_request r = {
        .model = {.layers = 4, .hidden = 256, .heads = 4, .vocab = 256, .seq = 64},
        .cluster = {.gpus = ranks, .gpus_per_node = 8, .between_nodes = LINK_IB,
                    .flops_per_gpu = 0.4 * 989e12},
        .gpu_bytes = 80e9, .micro_batch = 1, .global_batch = 8,
        .recompute = -1, .dtype = dtype, .gather = PLAN_GATHER_PER_STEP,
        .activations = PLAN_ACTS_THIS_MODEL, .tp_count = PLAN_TP_THIS_MODEL};
    if (dtype == PRECISION_FP32) r.cluster.flops_per_gpu *= PLAN_FP32_PEAK_FRACTION;
    return r;
}

plan_request predict_mesh_moe_request(int ranks, precision dtype) {
    plan_request r = predict_mesh_request(ranks, dtype);
    r.moe = (plan_moe){.experts = 4, .top_k = 2, .every = 2, .expert_ffn = 4 * r.model.hidden,
                       .capacity_factor = 1.25};
    r.ep = 2;
    /* one micro-batch of 2 a step: bf16's MoE, accumulating two, drifts past chapter 11's
     * loss bound by the third step (a flipped top-k choice) */
    r.micro_batch = 2;
    return r;
}

void predict_mesh_moe_flags(const plan_request *r, char *flags, size_t size) {
    flags[0] = '\0';
    if (r->moe.experts > 0)
        snprintf(flags, size, " --ep %d --experts %d --moe-every %d --top-k %d"
                 " --capacity-factor %g", r->ep, r->moe.experts, r->moe.every, r->moe.top_k,
                 r->moe.capacity_factor);
}

const char *predict_mesh_flags(const plan_mesh *m, char *flags, size_t size) {
    if (m->recompute != RECOMPUTE_NONE)
        return "chapter 11 does not recompute activations";
    const int cp = plan_cp_size(m);
    snprintf(flags, size, " --tp %d%s --cp %d%s --pp %d --dp-shard %d --dp-replicate %d"
             " --zero %d --micro %d --schedule 1f1b", m->tp, m->sequence_parallel ? " --sp" : "",
             cp, cp > 1 && m->cp_attention == CP_ULYSSES ? " --cp-attention ulysses" : "",
             m->pp, plan_dp_shard_size(m), plan_dp_replicas(m), m->zero_stage,
             plan_micro_batches(m));
    return NULL;
}

predict_mesh_figures predict_mesh_planned(const plan_request *r, const plan_mesh *m) {
    const plan_precision p = plan_precision_for(r);
    if (r->moe.experts > 0) {
        const plan_group_bytes b = plan_moe_this_model_bytes(&r->model, &r->moe, m, r->ep, p);
        return (predict_mesh_figures){
            .bytes = {b.tp, b.pp, b.dp, 0, b.cp, b.dp_replicate, b.expert_dp},
            .state = plan_moe_this_model_memory(&r->model, &r->moe, m, r->ep, p)};
    }
    const plan_group_bytes b = plan_bytes_sent(&r->model, m, p);
    return (predict_mesh_figures){.bytes = {b.tp, b.pp, b.dp, 0, b.cp, b.dp_replicate, 0},
                                  .state = plan_memory_per_gpu(&r->model, m, p)};
}

/* {"runs": [..., {"bytes_per_group_kind": {...}, "state_largest_per_tag": {...}}]}:
 * the run with a mesh (chapter 11 calls it mesh, or 3d) */
int mesh_json_figures(const char *json, predict_mesh_figures *out) {
    char err[256];
    json_doc *doc = json_parse(json, strlen(json), err, sizeof err);
    if (!doc) {
        fprintf(stderr, "predict: chapter 11's --json does not parse: %s\n", err);
        return 0;
    }
    const json_value *runs = json_get(json_root(doc), "runs");
    const json_value *run = json_find(runs, "strategy", "mesh");
    if (!run) run = json_find(runs, "strategy", "3d");
    const json_value *bytes = json_get(run, "bytes_per_group_kind");
    const json_value *state = json_get(run, "state_largest_per_tag");
    /* the planner's model states are a step's peak: its working buffers with the shards */
    const json_value *peak = json_get(run, "state_peak_largest_per_tag");
    int ok = run != NULL;
    for (int k = 0; k < PREDICT_MESH_GROUPS; k++)
        ok = ok && json_double(json_get(bytes, group_names[k]), &out->bytes[k]);
    ok = ok && json_double(json_get(peak, "params"), &out->state.params) &&
         json_double(json_get(peak, "grads"), &out->state.grads) &&
         json_double(json_get(peak, "optimizer"), &out->state.optimizer) &&
         json_double(json_get(state, "activations"), &out->state.activations);
    json_free(doc);
    return ok;
}

int predict_mesh_compare(const predict_mesh_figures *p, const predict_mesh_figures *m,
                         double *activation_error) {
    int mismatches = 0;
    for (int k = 0; k < PREDICT_MESH_GROUPS; k++)
        mismatches += k != EMBEDDING && p->bytes[k] != m->bytes[k];
    mismatches += (p->state.params != m->state.params) + (p->state.grads != m->state.grads) +
                  (p->state.optimizer != m->state.optimizer) +
                  (p->state.activations != m->state.activations);
    *activation_error = fabs(p->state.activations / m->state.activations - 1);
    return mismatches;
}

static void print_bytes_row(const char *name, double predicted, double measured, int counted) {
    char a[32], b[32];
    if (!counted)
        printf("  %-14s %12s %12s  not in the planner (the tied embedding's gradient, first and"
               " last stage)\n", name, "-", report_bytes(measured, b));
    else
        printf("  %-14s %12s %12s  %s\n", name, report_bytes(predicted, a),
               report_bytes(measured, b), predicted == measured ? "equal" : "DIFFERENT");
}

static const char *const run_words[PREDICT_MESH_RUNS] = {
    "the planner's mesh", "a ZeRO-3 mesh given to the planner",
    "a CP mesh given to the planner", "a TP + SP mesh given to the planner",
    "a Ulysses CP mesh given to the planner", "an MoE mesh given to the planner"};

/* r: the request the mesh was planned with (its ep and experts) */
static void print_mesh(int which, int ranks, const plan_request *r, const plan_mesh *x,
                       const predict_mesh_figures *p, const predict_mesh_figures *m,
                       const predict_options *o) {
    const int moe = r->moe.experts > 0, ep = moe ? r->ep : 1;
    if (o->json) {
        printf("%s{\"tp\": %d, \"cp\": %d, \"cp_attention\": \"%s\", \"pp\": %d, "
               "\"dp_shard\": %d, \"dp_replicate\": %d, \"ep\": %d, \"experts\": %d, "
               "\"zero\": %d, \"micro\": %d, \"ranks\": %d, \"bytes\": {",
               which == PREDICT_MESH_SEARCHED ? ",\n \"mesh\": "
               : which == PREDICT_MESH_ZERO3 ? ",\n \"given_meshes\": [" : ", ", x->tp,
               plan_cp_size(x), cp_attention_names[x->cp_attention], x->pp,
               plan_dp_shard_size(x), plan_dp_replicas(x), ep, r->moe.experts,
               x->zero_stage, plan_micro_batches(x), ranks);
        for (int k = 0; k < PREDICT_MESH_GROUPS; k++)
            printf("%s\"%s\": [%.0f, %.0f]", k ? ", " : "", group_names[k], p->bytes[k],
                   m->bytes[k]);
        printf("}, \"state\": {\"params\": [%.0f, %.0f], \"grads\": [%.0f, %.0f], "
               "\"optimizer\": [%.0f, %.0f], \"activations\": [%.0f, %.0f]}}", p->state.params,
               m->state.params, p->state.grads, m->state.grads, p->state.optimizer,
               m->state.optimizer, p->state.activations, m->state.activations);
        return;
    }
    printf("\n%s trained (chapter 11, bench256 on %d ranks, %s): tp %d%s x cp %d"
           " x pp %d x dp %d (%d shards x %d replicas), ZeRO-%d%s, %d micro-batches of %d,"
           " recomputation none\n  %-14s %12s %12s\n", run_words[which], ranks,
           precision_name(o->dtype), x->tp, x->sequence_parallel ? " + SP" : "",
           plan_cp_size(x), x->pp, x->dp,
           plan_dp_shard_size(x), plan_dp_replicas(x), x->zero_stage,
           x->zero_stage == 3 ? " (gathered once a step)" : "", plan_micro_batches(x),
           x->micro_batch, "bytes a step", "planner", "measured");
    for (int k = 0; k < PREDICT_MESH_GROUPS; k++)
        print_bytes_row(group_names[k], p->bytes[k], m->bytes[k], k != EMBEDDING);
    if (moe)
        printf("  %-14s %12s %12s  the all-to-alls carry the rows the routing sends: data, not"
               " a formula\n  (MoE every %d blocks, %d experts, top-%d, capacity %g, ep %d:"
               " this model's MoE count)\n", "ep", "-", "-", r->moe.every, r->moe.experts,
               r->moe.top_k, r->moe.capacity_factor, ep);
    printf("  %-14s (the GPU that holds the most, at its peak in a step)\n", "memory");
    print_bytes_row("params", p->state.params, m->state.params, 1);
    print_bytes_row("grads", p->state.grads, m->state.grads, 1);
    print_bytes_row("optimizer", p->state.optimizer, m->state.optimizer, 1);
    print_bytes_row("activations", p->state.activations, m->state.activations, 1);
}

plan_mesh predict_mesh_given(int which, int *ranks) {
    *ranks = 4;
    if (which == PREDICT_MESH_ZERO3) return (plan_mesh){.tp = 1, .pp = 2, .dp = 2, .zero_stage = 3};
    /* plan_evaluate adds SP to tp > 1 */
    if (which == PREDICT_MESH_TP) return (plan_mesh){.tp = 2, .pp = 1, .dp = 2};
    /* Ulysses splits the heads over tp x cp: 4 heads, one a rank */
    if (which == PREDICT_MESH_ULYSSES)
        return (plan_mesh){.tp = 2, .cp = 2, .cp_attention = CP_ULYSSES, .pp = 1, .dp = 1};
    /* ep 2 out of dp 4: two experts a rank, each held by expert_dp 2 ranks */
    if (which == PREDICT_MESH_MOE) return (plan_mesh){.tp = 1, .pp = 1, .dp = 4, .zero_stage = 1};
    return (plan_mesh){.tp = 1, .cp = 2, .cp_attention = CP_RING, .pp = 2, .dp = 1};
}

/* The request a run's mesh is planned with: the MoE mesh's has the experts. */
static plan_request request_of(int which, int ranks, precision dtype) {
    return which == PREDICT_MESH_MOE ? predict_mesh_moe_request(ranks, dtype)
                                     : predict_mesh_request(ranks, dtype);
}

/* The mesh of a run: the search's, or one given; 0 with a line when there is none. */
static int plan_run(int which, const predict_options *o, predict_mesh_run *run) {
    const plan_request r = predict_mesh_request(PREDICT_MESH_RANKS, o->dtype);
    plan_row row;
    if (which == PREDICT_MESH_SEARCHED) {
        run->ranks = PREDICT_MESH_RANKS;
        if (!plan_best_mesh(&r, &row)) {
            fprintf(stderr, "predict: the planner found no mesh for bench256 on %d GPUs\n",
                    PREDICT_MESH_RANKS);
            return 0;
        }
    } else {
        const plan_mesh given = predict_mesh_given(which, &run->ranks);
        const plan_request on = request_of(which, run->ranks, o->dtype);
        row = plan_evaluate(&on, "mesh", given);
    }
    run->mesh = row.mesh;
    return 1;
}

/* Plans, trains and compares one mesh; 0 when chapter 11 fails or cannot train it. */
static int mesh_run(const char *programs_dir, int which, const predict_options *o,
                    int *mismatches, double *activation_error) {
    predict_mesh_run run;
    char flags[320];
    if (!plan_run(which, o, &run)) return 0;
    const plan_request r = request_of(which, run.ranks, o->dtype);
    const char *why = predict_mesh_flags(&run.mesh, flags, sizeof flags);
    if (why) {
        fprintf(stderr, "predict: the planner's mesh cannot be trained: %s\n", why);
        return 0;
    }
    const size_t used = strlen(flags);
    predict_mesh_moe_flags(&r, flags + used, sizeof flags - used);
    char *json = run_chapter_json_with(programs_dir, 11, run.ranks, o, flags);
    const int ok = json && mesh_json_figures(json, &run.measured);
    free(json);
    if (!ok) return 0;
    const predict_mesh_figures predicted = predict_mesh_planned(&r, &run.mesh);
    if (o->mesh_run) o->mesh_run[which] = run;
    double error;
    *mismatches += predict_mesh_compare(&predicted, &run.measured, &error);
    if (error > *activation_error) *activation_error = error;
    print_mesh(which, run.ranks, &r, &run.mesh, &predicted, &run.measured, o);
    return 1;
}

int predict_mesh_in(const char *programs_dir, const predict_options *o, int *mismatches,
                    double *activation_error) {
    *activation_error = 0;
    if (o->mesh_run) memset(o->mesh_run, 0, PREDICT_MESH_RUNS * sizeof *o->mesh_run);
    for (int which = 0; which < PREDICT_MESH_RUNS; which++)
        if (!mesh_run(programs_dir, which, o, mismatches, activation_error)) return 0;
    if (o->json) printf("]");
    return 1;
}
