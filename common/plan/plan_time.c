#include "plan_time.h"

#include "plan_cp.h"

plan_link plan_link_of(comm_link link) {
    /* the threads backend's modelled wire */
    const comm_link_figures figures = comm_link_spec(link);
    return (plan_link){figures.bandwidth, figures.latency};
}

double plan_link_seconds(plan_link link, double bytes) {
    return link.bandwidth > 0 ? link.latency + bytes / link.bandwidth : 0;
}

double plan_allreduce_seconds(plan_link link, int ranks, double bytes) {
    return 2 * plan_gather_seconds(link, ranks, bytes);
}

double plan_gather_seconds(plan_link link, int ranks, double bytes) {
    if (ranks <= 1 || link.bandwidth <= 0) return 0;
    return (ranks - 1) * link.latency + (ranks - 1.0) / ranks * bytes / link.bandwidth;
}

double plan_allreduce_naive_seconds(plan_link link, int ranks, double bytes) {
    if (ranks <= 1) return 0;
    return ranks * plan_link_seconds(link, bytes);
}

int plan_doubling_rounds(int ranks) {
    int p = 1, rounds = 0;
    while (2 * p <= ranks) { p *= 2; rounds++; }
    return rounds + (p != ranks ? 2 : 0);
}

double plan_allreduce_doubling_seconds(plan_link link, int ranks, double bytes) {
    if (ranks <= 1) return 0;
    return plan_doubling_rounds(ranks) * plan_link_seconds(link, bytes);
}

plan_link plan_link_scaled(plan_link link, double scale) {
    return (plan_link){link.bandwidth / scale, link.latency * scale};
}

double plan_flops_per_iteration(const plan_model *m, int global_batch,
                                plan_recompute recompute) {
    const double B = global_batch, s = m->seq, l = m->layers, h = m->hidden, V = m->vocab;
    const double one_pass = 24 * B * s * l * h * h * (1 + s / (6 * h));
    const double passes = recompute == RECOMPUTE_FULL ? 4 : 3;
    const double attention_again = recompute == RECOMPUTE_SELECTIVE ? 4 * B * s * s * h * l : 0;
    return passes * one_pass + attention_again + 6 * B * s * h * V;
}

/* The link a group uses: NVLink when its ranks, `stride` apart, fit in one node. */
static plan_link group_link(const plan_cluster *c, int ranks, int stride) {
    const int in_node = (long)ranks * stride <= c->gpus_per_node;
    return plan_link_of(in_node ? LINK_NVLINK : c->between_nodes);
}

/* b x s/cp x h activations: TP's all-reduce buffer (PP sends it / t) */
static double activation_message(const plan_model *m, const plan_mesh *mesh,
                                 plan_precision precision) {
    return precision.activation * m->seq / plan_cp_size(mesh) * mesh->micro_batch * m->hidden;
}

/* TP's all-reduces per iteration on one stage: 4 a layer and micro-batch, 6 with full
 * recomputation (the forward's two again) */
static double tp_calls(const plan_model *m, const plan_mesh *mesh, int micro_batches) {
    const int per_layer = mesh->recompute == RECOMPUTE_FULL ? 6 : 4;
    return (double)plan_layers_per_stage(m, mesh->pp) * micro_batches * per_layer;
}

/* This model's tp bytes on stage k a micro-batch (PLAN_TP_THIS_MODEL): the layers' 4
 * all-reduces of N x h activations (6 with full recomputation), the vocab-parallel
 * embedding's (first stage) and the head's input gradient's with the loss's 3 N fp32
 * numbers (last stage), each a ring's 2 (t-1)/t; with SP, which makes every all-reduce
 * a reduce-scatter and an all-gather of the same bytes, the backward also gathers each
 * layer's 2 column-parallel inputs again, (t-1)/t of N x h each, and all-reduces the
 * weight and bias gradients (2 h fp32) of its 2 LayerNorms and the final one. */
static double this_model_tp_stage(const plan_model *m, const plan_mesh *mesh, int stage,
                                  double activations) {
    const double t = mesh->tp, ring = 2 * (t - 1) / t, f32 = sizeof(float);
    const double rows = (double)m->seq / plan_cp_size(mesh) * mesh->micro_batch;
    const int layers = plan_stage_layers(m, mesh->pp, stage), last = stage == mesh->pp - 1;
    const double per_layer = mesh->recompute == RECOMPUTE_FULL ? 6 : 4;
    double bytes = ring * activations * (per_layer * layers + (stage == 0) + last);
    bytes += last ? ring * 3 * rows * f32 : 0;
    if (mesh->sequence_parallel)
        bytes += (t - 1) / t * 2 * layers * activations +
                 ring * (2.0 * layers + last) * 2 * m->hidden * f32;
    return bytes;
}

/* The tp bytes a micro-batch on the stage that sends the most, by the mesh's count. */
static double tp_bytes_per_micro_batch(const plan_model *m, const plan_mesh *mesh,
                                       double activations) {
    if (mesh->tp == 1) return 0;
    if (mesh->tp_count == PLAN_TP_PAPER)
        return tp_calls(m, mesh, 1) * 2 * (mesh->tp - 1.0) / mesh->tp * activations;
    const double first = this_model_tp_stage(m, mesh, 0, activations);
    const double last = this_model_tp_stage(m, mesh, mesh->pp - 1, activations);
    return first > last ? first : last;
}

/* The papers' count: its all-reduces of b s h activations. This model's: the same
 * all-reduces' latencies, and its bytes (tp_bytes_per_micro_batch: the vocab-parallel
 * embedding's and head's, SP's regathers and LayerNorm gradients too) at the link's
 * bandwidth; a ring all-reduce's bytes are 2 (t-1)/t of its buffer, as both count them. */
static double tp_seconds(const plan_model *m, const plan_mesh *mesh, const plan_cluster *c,
                         int micro_batches, plan_precision precision) {
    if (mesh->tp == 1) return 0;
    const plan_link link = group_link(c, mesh->tp, 1);
    const double message = activation_message(m, mesh, precision);
    const double calls = tp_calls(m, mesh, micro_batches);
    if (mesh->tp_count == PLAN_TP_PAPER || link.bandwidth <= 0)
        return calls * plan_allreduce_seconds(link, mesh->tp, message);
    return calls * 2 * (mesh->tp - 1) * link.latency +
           micro_batches * tp_bytes_per_micro_batch(m, mesh, message) / link.bandwidth;
}

static double pp_seconds(const plan_model *m, const plan_mesh *mesh, const plan_cluster *c,
                         int micro_batches, plan_precision precision) {
    if (mesh->pp == 1) return 0;
    const double bytes = activation_message(m, mesh, precision) / mesh->tp;
    /* the next stage is tp x cp x dp ranks away */
    plan_link link = group_link(c, 2, mesh->tp * plan_cp_size(mesh) * mesh->dp);
    return 2.0 * micro_batches * plan_link_seconds(link, bytes);
}

/* ZeRO-3's passes a step over a layer's weights of `weights` bytes and gradient of
 * `grads`: per micro-batch an all-gather in forward and one in backward and a
 * reduce-scatter, or once a step an all-gather and a reduce-scatter (plan_zero3_gather);
 * f gives the seconds or bytes of one pass. */
static double zero3_passes(const plan_mesh *mesh, int micro_batches, double weights,
                           double grads, double (*f)(const void *, double),
                           const void *ctx) {
    if (mesh->gather == PLAN_GATHER_PER_STEP) return f(ctx, weights) + f(ctx, grads);
    return (double)micro_batches * (2 * f(ctx, weights) + f(ctx, grads));
}

typedef struct {
    plan_link link;
    int ranks;
} gather_on;

static double gather_seconds_on(const void *ctx, double bytes) {
    const gather_on *g = ctx;
    return plan_gather_seconds(g->link, g->ranks, bytes);
}

static double ring_pass_bytes(const void *ctx, double bytes) {
    const int n = *(const int *)ctx;
    return (n - 1.0) / n * bytes;
}

/* ZeRO 0-2: the gradients all-reduced once per iteration over dp x cp (the cp ranks saw
 * other tokens). ZeRO-3: per micro-batch the weights all-gathered in forward and backward
 * and the gradients reduce-scattered, over the shard group (dp x cp, or HSDP's dp_shard
 * x cp); with HSDP's replicas, each rank's gradient shard then all-reduced across them
 * once per iteration. One message per layer: each carries 1/layers of the elements. */
static double dp_seconds(const plan_model *m, const plan_mesh *mesh, const plan_cluster *c,
                         int micro_batches, plan_precision precision) {
    const int cp = plan_cp_size(mesh), shards = plan_dp_shard_size(mesh) * cp;
    const int replicas = plan_dp_replicas(mesh);
    if (shards * replicas == 1) return 0;
    const double params = plan_mesh_params_per_gpu(m, mesh);
    const int layers = plan_layers_per_stage(m, mesh->pp);
    const double weights = plan_gathered_bytes(precision) * params / layers;
    const double grads = precision.grads * params / layers;
    if (mesh->zero_stage < 3)
        return layers * plan_allreduce_seconds(group_link(c, shards * replicas, mesh->tp),
                                               shards * replicas, grads);
    const plan_link shard_link = group_link(c, shards, mesh->tp);
    const plan_link replica_link = group_link(c, replicas, mesh->tp * shards);
    const gather_on on_shards = {shard_link, shards};
    return layers * zero3_passes(mesh, micro_batches, weights, grads, gather_seconds_on,
                                 &on_shards) +
           layers * plan_allreduce_seconds(replica_link, replicas, grads / shards);
}

/* Context parallelism: every layer's K/V blocks or all-to-alls (plan_cp.h), on the CP
 * group's link, tp ranks apart. */
static double cp_seconds(const plan_model *m, const plan_mesh *mesh, const plan_cluster *c,
                         int micro_batches, plan_precision precision) {
    const int cp = plan_cp_size(mesh);
    if (cp == 1) return 0;
    const plan_link link = group_link(c, cp, mesh->tp);
    const double calls = (double)plan_layers_per_stage(m, mesh->pp) * micro_batches;
    return calls * plan_cp_seconds_per_layer(m, mesh, precision.activation, link.latency,
                                             link.bandwidth);
}

plan_step plan_step_time(const plan_model *m, const plan_mesh *mesh,
                         const plan_cluster *cluster, plan_precision precision) {
    plan_step t = {0};
    const int micro_batches = plan_micro_batches(mesh);
    if (micro_batches == 0) return t;
    t.compute = plan_flops_per_iteration(m, mesh->global_batch, mesh->recompute) /
                (cluster->gpus * cluster->flops_per_gpu);
    t.bubble = t.compute * (mesh->pp - 1) / micro_batches;
    t.tp_comm = tp_seconds(m, mesh, cluster, micro_batches, precision);
    t.pp_comm = pp_seconds(m, mesh, cluster, micro_batches, precision);
    t.dp_comm = dp_seconds(m, mesh, cluster, micro_batches, precision);
    t.cp_comm = cp_seconds(m, mesh, cluster, micro_batches, precision);
    t.total = t.compute + t.bubble + t.tp_comm + t.pp_comm + t.dp_comm + t.cp_comm;
    return t;
}

void plan_dp_bytes(const plan_mesh *mesh, double params, plan_precision precision, int shards,
                   int replicas, double *dp, double *dp_replicate) {
    const double weights = plan_gathered_bytes(precision) * params;
    const double grads = precision.grads * params;
    *dp = *dp_replicate = 0;
    if (mesh->zero_stage < 3) {
        const int n = shards * replicas;
        *dp = 2 * (n - 1.0) / n * grads;
        return;
    }
    *dp = zero3_passes(mesh, plan_micro_batches(mesh), weights, grads, ring_pass_bytes, &shards);
    *dp_replicate = 2 * (replicas - 1.0) / replicas * grads / shards;
}

plan_group_bytes plan_bytes_sent(const plan_model *m, const plan_mesh *mesh,
                                 plan_precision precision) {
    plan_group_bytes b = {0};
    const int micro_batches = plan_micro_batches(mesh);
    const double activations = activation_message(m, mesh, precision);
    const int cp = plan_cp_size(mesh), shards = plan_dp_shard_size(mesh) * cp;
    const int replicas = plan_dp_replicas(mesh);
    const double params = plan_mesh_params_per_gpu(m, mesh);
    b.tp = micro_batches * tp_bytes_per_micro_batch(m, mesh, activations);
    if (mesh->pp > 1)
        b.pp = (mesh->pp > 2 ? 2 : 1) * micro_batches * activations / mesh->tp;
    plan_dp_bytes(mesh, params, precision, shards, replicas, &b.dp, &b.dp_replicate);
    b.cp = (double)plan_layers_per_stage(m, mesh->pp) * micro_batches *
           plan_cp_bytes_per_layer(m, mesh, precision.activation);
    return b;
}

double plan_training_seconds_at(const plan_model *m, int global_batch,
                                plan_recompute recompute, double tokens, int gpus,
                                double flops_per_gpu) {
    const double iterations = tokens / ((double)global_batch * m->seq);
    return iterations * plan_flops_per_iteration(m, global_batch, recompute) /
           (gpus * flops_per_gpu);
}
