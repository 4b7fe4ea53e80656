/* The whole model trained with tensor parallelism (times data parallelism when there
 * are more ranks than the TP size), as a configuration of the mesh trainer
 * (parallelize.h, pp_train.h: one stage, one micro-batch, ZeRO 0 over dp):
 *
 *   every TP rank: the same batch, its slice of every block (heads, MLP units) and of
 *                  the vocabulary (embedding rows = LM head rows); the blocks all-reduce
 *                  inside (g forward, f backward), the loss is assembled from per-token
 *                  maxima and sums (common/vocab_parallel.c)
 *   every DP group of TP ranks: its share of the batch; gradients summed over groups
 *                  (dp_grads.h, DDP's buckets)
 *   optimizer: plain AdamW on the slice; replicated tensors get identical gradients
 *              on every TP rank, so their copies stay identical
 *
 * Mixed precision (bf16, fp16): the slice's fp32 masters and their 16-bit compute copy,
 * rounded by AdamW as it updates them; f and g all-reduce 16-bit activations, dp the fp32
 * gradients (16-bit ones with --grad-dtype). The vocabulary is split in every
 * precision: in 16 bits the slice's logits are 16-bit and the vocab-parallel softmax
 * widens them to fp32 (vocab_parallel.h), as one device's loss does. Here: the run and
 * what it measures (its sizes: tp_sizes.c; chapter 3's formulas: tp_bytes.c). */
#include "tp_train.h"

#include <stdio.h>
#include <string.h>

#include "compare.h"
#include "pp_train.h"
#include "tolerances.h"

/* ---- training: a configuration of the mesh trainer --------------------------------- */

/* tp_bytes_formula counts dp's all-reduce at 4 B a gradient; 16-bit gradients
 * (--grad-dtype) move 2: what they leave off, 2 (d-1)/d x 2 B per parameter. */
static double grads16_bytes_saved(const run_config *cfg, int d, size_t params) {
    const double saved = sizeof(float) - (double)precision_bytes(cfg->grad_precision);
    return 2.0 * (d - 1) / d * (double)params * saved;
}

/* The textbook bytes of the run (chapter 3's formula): TP's, SP's, recomputation's and
 * DP's; -1 where the all-reduce is not the ring. */
static double run_bytes_formula(const run_config *cfg, const tp_options *o, int t, int d,
                                size_t params) {
    const int B = cfg->batch / d, T = cfg->model.ctx;
    if (cfg->comm.allreduce != ALLREDUCE_RING) return -1;
    const double formula = o->sequence_parallel
        ? tp_sequence_bytes_formula(&cfg->model, cfg->precision, B, T, t, d, params)
        : tp_bytes_formula(&cfg->model, cfg->precision, B, T, t, d, params);
    const double again = o->checkpoint_activations
                             ? tp_recompute_bytes(&cfg->model, cfg->precision, B, T, t) : 0;
    return formula + again - grads16_bytes_saved(cfg, d, params);
}

/* The run's TP numbers (tp_extra) from the groups' statistics after the loop, on every
 * rank; world rank 0's outcome keeps them (its replica drift comes with the final
 * parameters). */
static void tp_measure(comm *world, pipeline_rank *r, void *ctx, strategy_outcome *out) {
    (void)world;
    const tp_options *o = ctx;
    const mesh *m = r->mesh;
    const int t = m->shape.tp, d = m->shape.dp;
    const gpt_shape *s = &r->chunks[0].shape;   /* one stage: the whole TP slice */
    const double timed = out->result.timed_steps > 0 ? out->result.timed_steps : 1;
    comm_stats tp_stats = comm_stats_get(m->tp), dp_stats = comm_stats_get(r->par.grads);
    out->result.bytes_formula = run_bytes_formula(r->cfg, o, t, d, gpt_num_params(s));
    if (!out->extra || !strategy_outcome_keeps(out)) return;
    *(tp_extra *)out->extra = (tp_extra){
        .tp = t, .dp = d, .vocab_parallel = s->vocab_parallel, .vocab_local = s->vocab_local,
        .vocab_padding = s->vocab_local * t - r->cfg->model.vocab,
        .params_per_rank = gpt_num_params(s), .sequence_parallel = o->sequence_parallel,
        .allreduces_per_step = tp_stats.calls[COMM_KIND_ALLREDUCE] / timed,
        .gathers_per_step = (tp_stats.calls[COMM_KIND_ALLGATHER] +
                             tp_stats.calls[COMM_KIND_REDUCE_SCATTER]) / timed,
        .dp_allreduces_per_step = d > 1 ? dp_stats.calls[COMM_KIND_ALLREDUCE] / timed : 0,
        .bytes_tp_per_step = comm_stats_total_sent(&tp_stats) / timed,
        .tp_allreduce_bytes = tp_stats.bytes_sent[COMM_KIND_ALLREDUCE] / timed,
        .tp_reduce_scatter_bytes = tp_stats.bytes_sent[COMM_KIND_REDUCE_SCATTER] / timed,
        .tp_allgather_bytes = tp_stats.bytes_sent[COMM_KIND_ALLGATHER] / timed,
        .bytes_dp_per_step = d > 1 ? comm_stats_total_sent(&dp_stats) / timed : 0};
}

void tp_train(comm *world, const mesh *m, const run_config *cfg, const tp_options *opts,
              const dataset *data, strategy_outcome *out) {
    const tp_options none = {0}, *o = opts ? opts : &none;
    const int sp = o->sequence_parallel, d = m->shape.dp;
    const pipeline_fault fault = o->drop_f_backward ? PIPELINE_FAULT_DROP_F_BACKWARD
                                 : o->sp_copy_not_reduce ? PIPELINE_FAULT_SP_OWN_PARTIAL
                                 : o->grads_over_tp ? PIPELINE_FAULT_GRADS_OVER_TP
                                                    : PIPELINE_FAULT_NONE;
    /* one stage, one micro-batch, the gradients all-reduced over dp (ZeRO 0) */
    const pipeline_options popts = {
        .schedule = PP_1F1B, .micro = 1, .chunks = 1, .sequence_parallel = sp,
        .layers = {.recompute_attention = o->recompute_attention,
                   .checkpoint_activations = o->checkpoint_activations,
                   .tp_overlap_chunks = o->tp_overlap_chunks,
                   .tp_overlap_control = o->tp_overlap_control},
        .bookkeeping_aside = 1, .fault = fault};
    const char *name = d > 1 ? (sp ? "tp+sp+dp" : "tp+dp") : (sp ? "tp+sp" : "tp");
    const double drift = pp_train_on_mesh(world, m, cfg, data, &popts, name, tp_measure,
                                          (void *)o, out);
    if (out->extra && strategy_outcome_keeps(out))
        ((tp_extra *)out->extra)->replica_drift = drift;
}

typedef struct {
    const run_config *cfg;
    const dataset *data;
    int tp;
    const tp_options *opts;
} tp_launch_args;

static void tp_rank_fn(comm *world, void *args, strategy_outcome *out) {
    const tp_launch_args *a = args;
    mesh m;
    mesh_create(&m, world, (mesh_shape){.tp = a->tp, .pp = 1, .dp = comm_size(world) / a->tp});
    tp_train(world, &m, a->cfg, a->opts, a->data, out);
    mesh_free(&m);
}

int tp_launch(const run_config *cfg, const dataset *data, int tp, const tp_options *opts,
              strategy_outcome *rank0_out) {
    tp_launch_args args = {cfg, data, tp > 0 ? tp : cfg->comm.ranks, opts};
    return strategy_launch(cfg, tp_rank_fn, &args, rank0_out);
}

double tp_worst_fraction_of_tolerance(const run_result *r) {
    return run_worst_fraction_of_tolerance(r, TOL_GRADS, TOL_LOSS, TOL_PARAMS);
}

/* ---- bounds in mixed precision -------------------------------------------------------- */


run_tolerances tp_run_tolerances(const run_config *cfg, int tp, const baseline_run *b) {
    return tolerances_for_tp(cfg, tp, b ? baseline_largest_grad(b) : 1.0);
}
