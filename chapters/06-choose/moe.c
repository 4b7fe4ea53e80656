/* A mixture of experts planned: its total and active parameters, FLOPs per token,
 * memory per GPU with its experts spread over ep ranks, and the all-to-all bytes,
 * next to a dense GPT of its active size on the same mesh. The formulas are
 * common/plan/plan_moe.h's. */
#include <stdio.h>
#include <string.h>

#include "planner.h"
#include "report.h"

#define GB 1e9

typedef struct {
    plan_model model;
    plan_mesh mesh;
    int valid;                   /* the mesh splits the model (dense: heads, layers) */
    plan_bytes memory;
    int fits;
    double params, active, training_flops;
} moe_side;

/* The mesh with the lightest recomputation that fits (or the one asked for). */
static moe_side evaluate(const plan_request *r, const plan_model *m, const plan_moe *moe, int ep) {
    moe_side side = {.model = *m, .mesh = r->mesh};
    side.valid = m->heads % r->mesh.tp == 0 && r->mesh.pp <= m->layers;
    side.params = plan_moe_total_params(m, moe);
    side.active = plan_moe_active_params(m, moe);
    side.training_flops = 3 * plan_moe_forward_flops_per_token(m, moe);
    plan_mesh *mesh = &side.mesh;
    mesh->sequence_parallel = mesh->tp > 1;
    const int first = r->recompute >= 0 ? r->recompute : RECOMPUTE_NONE;
    const int last = r->recompute >= 0 ? r->recompute : RECOMPUTE_FULL;
    for (int mode = first; side.valid && mode <= last; mode++) {
        mesh->recompute = (plan_recompute)mode;
        side.memory = plan_moe_memory_per_gpu(m, moe, mesh, ep, plan_precision_for(r));
        side.fits = plan_total(side.memory) <= r->gpu_bytes;
        if (side.fits) break;
    }
    return side;
}

static moe_side evaluate_moe(const plan_request *r) {
    return evaluate(r, &r->model, &r->moe, r->ep);
}

/* The planner's GPT shape for the MoE's active parameters, on the same mesh, no experts. */
static moe_side evaluate_dense(const plan_request *r, double active) {
    const plan_model dense = plan_shape_for_params(active, r->model.vocab, r->model.seq);
    return evaluate(r, &dense, &(plan_moe){0}, 1);
}

/* The EP group: ep ranks tp apart, inside a node when tp x ep GPUs fit one. */
static comm_link ep_link_of(const plan_request *r, int ep) {
    return (long)r->mesh.tp * ep <= r->cluster.gpus_per_node ? LINK_NVLINK
                                                             : r->cluster.between_nodes;
}
static comm_link ep_link(const plan_request *r) { return ep_link_of(r, r->ep); }

/* Tokens one GPU dispatches in an iteration: its replica's B s / dp, split tp ways by
 * sequence parallelism, through each MoE layer of its stage. */
static double alltoall_bytes_at(const plan_request *r, int ep) {
    const double tokens = (double)r->global_batch * r->model.seq / r->mesh.dp / r->mesh.tp;
    const int layers = plan_moe_layers_in(plan_layers_per_stage(&r->model, r->mesh.pp), &r->moe);
    return tokens * layers *
           plan_moe_alltoall_bytes_per_token(&r->moe, r->model.hidden,
                                             plan_precision_for(r).activation, ep);
}
static double alltoall_bytes_per_gpu(const plan_request *r) { return alltoall_bytes_at(r, r->ep); }

static void print_side(const char *name, const moe_side *s, int ep) {
    char b[5][32];
    printf("  %-6s %4d %4d %5d %4d %4d ", name, s->mesh.tp, s->mesh.pp, s->mesh.dp, ep,
           s->mesh.zero_stage);
    if (!s->valid) {
        printf("(the mesh does not split it: %d heads, %d layers)\n", s->model.heads,
               s->model.layers);
        return;
    }
    const plan_bytes *m = &s->memory;
    printf("%-9s %10s %10s %10s %10s %10s %5s\n", plan_recompute_names[s->mesh.recompute],
           report_bytes(m->params, b[0]), report_bytes(m->grads, b[1]),
           report_bytes(m->optimizer, b[2]), report_bytes(m->activations, b[3]),
           report_bytes(plan_total(*m), b[4]), s->fits ? "yes" : "no");
}

static void print_shapes(const moe_side *moe, const moe_side *dense) {
    printf("  %-26s %28s %28s\n", "", "MoE", "dense, same active size");
    char shape[2][64];
    snprintf(shape[0], 64, "%d x h %d, %d heads", moe->model.layers, moe->model.hidden,
             moe->model.heads);
    snprintf(shape[1], 64, "%d x h %d, %d heads", dense->model.layers, dense->model.hidden,
             dense->model.heads);
    printf("  %-26s %28s %28s\n", "layers, hidden, heads", shape[0], shape[1]);
    printf("  %-26s %28.4g %28.4g\n", "parameters", moe->params, dense->params);
    printf("  %-26s %28.4g %28.4g\n", "active parameters a token", moe->active, dense->active);
    printf("  %-26s %28.4g %28.4g\n", "training FLOPs a token", moe->training_flops,
           dense->training_flops);
    printf("  %-26s %28.4g %28.4g\n", "model states (16 B a param)", 16 * moe->params,
           16 * dense->params);
}

static void print_alltoall(const plan_request *r, double training_flops) {
    const double element = plan_precision_for(r).activation;
    const double per_token = plan_moe_alltoall_bytes_per_token(&r->moe, r->model.hidden, element, r->ep);
    const double per_gpu = alltoall_bytes_per_gpu(r);
    const double bandwidth = comm_link_spec(ep_link(r)).bandwidth;
    const double compute = training_flops * r->global_batch * r->model.seq /
                           (r->cluster.gpus * r->cluster.flops_per_gpu);
    char b[2][32];
    printf("\n  All-to-all, dispatch and combine, forward and backward: 2 x 2 x k %d x h %d x %g B"
           " x (ep - 1)/ep %d/%d\n  = %s a token per MoE layer leaving its GPU; %s a GPU per"
           " iteration (B s / (dp tp)\n  tokens x %d MoE layers of the first stage): %.3g s on"
           " %s, against %.3g s of compute\n", r->moe.top_k, r->model.hidden,
           element, r->ep - 1, r->ep, report_bytes(per_token, b[0]), report_bytes(per_gpu, b[1]),
           plan_moe_layers_in(plan_layers_per_stage(&r->model, r->mesh.pp), &r->moe),
           per_gpu / bandwidth, comm_link_spec(ep_link(r)).title, compute);
}

/* One ep of the mesh: its memory with the lightest recomputation that fits, and its
 * all-to-all. */
static plan_ep_option ep_option(const plan_request *r, int ep) {
    const moe_side side = evaluate(r, &r->model, &r->moe, ep);
    const comm_link link = ep_link_of(r, ep);
    const double bytes = alltoall_bytes_at(r, ep);
    return (plan_ep_option){.ep = ep, .recompute = side.mesh.recompute,
                            .total_bytes = plan_total(side.memory),
                            .fits = side.valid && side.fits, .alltoall_bytes = bytes,
                            .alltoall_seconds = bytes / comm_link_spec(link).bandwidth,
                            .link = link};
}

int plan_ep_options(const plan_request *r, plan_ep_option *out, int max) {
    int n = 0;
    for (int ep = 1; ep <= r->moe.experts && ep <= r->mesh.dp && n < max; ep++)
        if (r->moe.experts % ep == 0 && r->mesh.dp % ep == 0) out[n++] = ep_option(r, ep);
    return n;
}

int plan_best_ep(const plan_ep_option *o, int n) {
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (!o[i].fits) continue;
        if (best < 0 || o[i].recompute < o[best].recompute ||
            (o[i].recompute == o[best].recompute &&
             o[i].alltoall_seconds < o[best].alltoall_seconds))
            best = i;
    }
    return best;
}

static void print_ep_search(const plan_request *r) {
    plan_ep_option o[PLAN_MAX_EP_OPTIONS];
    const int n = plan_ep_options(r, o, PLAN_MAX_EP_OPTIONS), best = plan_best_ep(o, n);
    printf("\n  Every ep of this mesh (a divisor of the %d experts and dp %d):\n", r->moe.experts,
           r->mesh.dp);
    printf("  %4s %-9s %10s %5s %12s %10s  %s\n", "ep", "recompute", "total", "fits",
           "all-to-all", "seconds", "link");
    for (int i = 0; i < n; i++) {
        char b[2][32];
        printf("  %4d %-9s %10s %5s %12s %10.3g  %s\n", o[i].ep,
               plan_recompute_names[o[i].recompute], report_bytes(o[i].total_bytes, b[0]),
               o[i].fits ? "yes" : "no", report_bytes(o[i].alltoall_bytes, b[1]),
               o[i].alltoall_seconds, comm_link_spec(o[i].link).title);
    }
    if (best >= 0)
        printf("  the search's ep: %d (the lightest recomputation that fits, %s, then the least"
               " all-to-all: %.3g s an iteration)%s\n", o[best].ep,
               plan_recompute_names[o[best].recompute], o[best].alltoall_seconds,
               o[best].ep == r->ep ? ", the ep planned above" : "");
    else
        printf("  no ep fits this mesh: more GPUs, a deeper pipeline or ZeRO over dp\n");
}

static void print_gpt4_sources(void) {
    printf("  GPT-4's shape was never published by OpenAI. These are the figures of SemiAnalysis's"
           " report (Patel\n  and Wong, July 2023): about 1.8T parameters in 120 layers, 16"
           " experts of about 111B, 2 a token,\n  about 280B active, about 55B shared in"
           " attention; George Hotz's claim a month before (8 experts of\n  220B) differs in"
           " detail, and the course text says 1.7T. Rumours, never confirmed by OpenAI:\n  h 10752"
           " and 96 heads are ours, chosen to give those sums; the vocabulary is cl100k_base's"
           " 100,277,\n  the context 8192 (GPT-4's first).\n\n");
}

static void print_text(const plan_request *r, const moe_side *moe, const moe_side *dense) {
    const plan_moe *e = &r->moe;
    char line[512];
    printf("Planning a mixture of experts: %d experts of MLP size %.0f in %s layer, %d a token"
           " (top-%d),\non %d GPUs of %.0f GB (%d per node), %.0f TFLOP/s achieved per GPU;"
           " global batch %d sequences of %d,\nmicro-batch %d; %s\n\n", e->experts, e->expert_ffn,
           e->every == 1 ? "every" : "every other", e->top_k, e->top_k, r->cluster.gpus,
           r->gpu_bytes / GB, r->cluster.gpus_per_node, r->cluster.flops_per_gpu / 1e12,
           r->global_batch, r->model.seq, r->micro_batch,
           plan_precision_line(r, line, sizeof line));
    if (r->model_name && strcmp(r->model_name, "gpt4-moe") == 0) print_gpt4_sources();
    print_shapes(moe, dense);
    printf("\n  Memory per GPU (the first pipeline stage's), experts over ep ranks of the dp:\n");
    printf("  %-6s %4s %4s %5s %4s %4s %-9s %10s %10s %10s %10s %10s %5s\n", "", "tp", "pp", "dp",
           "ep", "zero", "recompute", "params", "grads", "optimizer", "activ.", "total", "fits");
    print_side("moe", moe, r->ep);
    print_side("dense", dense, 1);
    print_alltoall(r, moe->training_flops);
    print_ep_search(r);
}

static void json_side(const char *name, const moe_side *s) {
    const plan_bytes *m = &s->memory;
    printf(",\n \"%s\": {\"layers\": %d, \"hidden\": %d, \"heads\": %d, \"params\": %.0f,"
           " \"active_params\": %.0f, \"training_flops_per_token\": %.6g, \"recompute\": \"%s\",\n"
           "  \"memory_per_gpu\": {\"params\": %.0f, \"grads\": %.0f, \"optimizer\": %.0f,"
           " \"activations\": %.0f, \"total\": %.0f}, \"fits\": %s}", name, s->model.layers,
           s->model.hidden, s->model.heads, s->params, s->active, s->training_flops,
           plan_recompute_names[s->mesh.recompute], m->params, m->grads, m->optimizer,
           m->activations, plan_total(*m), s->valid && s->fits ? "true" : "false");
}

static void print_json(const plan_request *r, const moe_side *moe, const moe_side *dense) {
    const plan_moe *e = &r->moe;
    printf("{\"chapter\": \"06-choose\", \"precision\": \"%s\",\n \"moe_config\": {\"experts\": %d,"
           " \"top_k\": %d, \"every\": %d, \"expert_ffn\": %.0f},\n \"cluster\": {\"gpus\": %d,"
           " \"gpus_per_node\": %d, \"gpu_bytes\": %.0f, \"flops_per_gpu\": %.6g, \"global_batch\":"
           " %d, \"micro_batch\": %d},\n \"mesh\": {\"tp\": %d, \"pp\": %d, \"dp\": %d, \"ep\": %d,"
           " \"zero_stage\": %d}", precision_name(r->dtype), e->experts, e->top_k, e->every,
           e->expert_ffn, r->cluster.gpus, r->cluster.gpus_per_node, r->gpu_bytes,
           r->cluster.flops_per_gpu, r->global_batch, r->micro_batch, r->mesh.tp, r->mesh.pp,
           r->mesh.dp, r->ep, r->mesh.zero_stage);
    json_side("moe", moe);
    json_side("dense", dense);
    printf(",\n \"alltoall_bytes_per_token_per_layer\": %.6g, \"alltoall_bytes_per_gpu_per_iteration\":"
           " %.6g", plan_moe_alltoall_bytes_per_token(e, r->model.hidden,
                                                     plan_precision_for(r).activation, r->ep),
           alltoall_bytes_per_gpu(r));
    plan_ep_option o[PLAN_MAX_EP_OPTIONS];
    const int n = plan_ep_options(r, o, PLAN_MAX_EP_OPTIONS), best = plan_best_ep(o, n);
    printf(",\n \"ep_search\": [");
    for (int i = 0; i < n; i++)
        printf("%s{\"ep\": %d, \"recompute\": \"%s\", \"total\": %.0f, \"fits\": %s,"
               " \"alltoall_seconds\": %.6g}", i ? ", " : "", o[i].ep,
               plan_recompute_names[o[i].recompute], o[i].total_bytes,
               o[i].fits ? "true" : "false", o[i].alltoall_seconds);
    printf("], \"ep_best\": %d", best >= 0 ? o[best].ep : 0);
    failures_print_json(r);
    printf("}\n");
}

void moe_print(const plan_request *r, int json) {
    const moe_side moe = evaluate_moe(r);
    const moe_side dense = evaluate_dense(r, moe.active);
    if (json) {
        print_json(r, &moe, &dense);
        return;
    }
    print_text(r, &moe, &dense);
    failures_print(r);
}
