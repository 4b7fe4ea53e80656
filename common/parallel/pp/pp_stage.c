#include "pp_stage.h"

#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "cp_split.h"
#include "floats.h"
#include "grads16.h"
#include "ops.h"
#include "ops_mixed.h"
#include "pp_schedule.h"

/* Tags keep activations and gradients apart: a stage may have one of each in flight
 * to the same neighbour. */
enum { TAG_ACTIVATION = 1, TAG_GRADIENT = 2 };

void pp_stage_init(pp_stage *st, comm *pp, const gpt_shape *whole, int stage, int stages,
                   int micro_batch, int T, int max_in_flight, uint64_t seed,
                   const gpt_model_options *model_opts, int owns_state) {
    gpt_model_options opts = model_opts ? *model_opts : (gpt_model_options){0};
    *st = (pp_stage){.stage = stage, .stages = stages, .shape = *whole, .pp = pp,
                     .micro_batch = micro_batch, .T = T, .owns_state = owns_state,
                     .span = opts.positions, .T_whole = T};
    if (st->span) {   /* a CP rank: the span's rows of whole sequences */
        st->T = T = position_span_rows(st->span);
        st->whole_batch = mem_alloc(MEM_OTHER, 2 * (size_t)micro_batch * st->T_whole * sizeof(int));
    }
    gpt_shape_split_stages(&st->shape, stages, stage);
    st->precision = opts.precision;
    if (owns_state) {
        replica_init(&st->rep, &st->shape, seed, 1);
        replica_set_precision(&st->rep, opts.precision);
    } else {
        st->rep = (replica){.shape = st->shape, .num_params = gpt_num_params(&st->shape),
                            .precision = opts.precision};
    }
    opts.max_slots = max_in_flight;
    st->model = gpt_model_create(&st->shape, micro_batch, T, &opts);
    st->boundary_numel = gpt_stage_boundary_numel(st->model);   /* SP: T/tp rows of each */
}

void pp_stage_free(pp_stage *st) {
    gpt_model_free(st->model);
    mem_free(st->whole_batch);
    if (st->owns_state) replica_free(&st->rep);
    st->model = NULL;
}

int pp_stage_is_first(const pp_stage *st) { return st->stage == 0; }
int pp_stage_is_last(const pp_stage *st) { return st->stage == st->stages - 1; }
int pp_stage_rank_of(const pp_stage *st, int stage) {
    int rank, chunk;
    pp_place_of(st->vshape, comm_size(st->pp), stage, &rank, &chunk);
    return rank;
}

size_t pp_boundary_bytes(const pp_stage *st) {
    return st->boundary_numel * precision_bytes(st->precision);
}

void pp_recv_input_into(pp_stage *st, void *x) {
    comm_recv(st->pp, x, st->boundary_numel, comm_dtype_of(st->precision),
              pp_stage_rank_of(st, st->stage - 1), TAG_ACTIVATION);
}

void pp_recv_input(pp_stage *st, int slot) {
    gpt_use_slot(st->model, slot);
    pp_recv_input_into(st, gpt_stage_input(st->model));
}

void pp_send_output(pp_stage *st, int slot) {
    gpt_use_slot(st->model, slot);
    comm_send(st->pp, gpt_stage_output(st->model), st->boundary_numel,
              comm_dtype_of(st->precision), pp_stage_rank_of(st, st->stage + 1), TAG_ACTIVATION);
}

void pp_recv_output_grad(pp_stage *st, int slot) {
    gpt_use_slot(st->model, slot);
    comm_recv(st->pp, gpt_stage_output_grad(st->model), st->boundary_numel,
              comm_dtype_of(st->precision), pp_stage_rank_of(st, st->stage + 1), TAG_GRADIENT);
}

void pp_send_input_grad(pp_stage *st, const void *dx) {
    if (st->drop_input_grad) mixed_vec_zero(st->precision, (void *)dx, st->boundary_numel);
    comm_send(st->pp, dx, st->boundary_numel, comm_dtype_of(st->precision),
              pp_stage_rank_of(st, st->stage - 1), TAG_GRADIENT);
}

/* A CP rank's rows of the micro-batch's whole sequences, tokens and targets. */
static void load_span(pp_stage *st, const dataset *data, const run_config *cfg, int step,
                      int first) {
    const int B = st->micro_batch, T = st->T_whole;
    int *tokens = st->whole_batch, *targets = st->whole_batch + (size_t)B * T;
    dataset_batch(data, cfg->seed, step, first, B, T, tokens, targets);
    int *rows = gpt_host_batch(st->model);
    const size_t n = (size_t)B * st->T;
    cp_span_rows(st->span, B, T, tokens, rows);
    cp_span_rows(st->span, B, T, targets, rows + n);
    gpt_set_batch(st->model, rows, rows + n);
}

float pp_forward(pp_stage *st, int slot, const dataset *data, const run_config *cfg,
                 int step, int first) {
    gpt_use_slot(st->model, slot);
    if (st->span && (pp_stage_is_first(st) || pp_stage_is_last(st)))
        load_span(st, data, cfg, step, first);
    else if (pp_stage_is_first(st) || pp_stage_is_last(st))
        load_batch(st->model, data, cfg, step, first, st->micro_batch);
    return gpt_forward(st->model, st->rep.compute);
}

void pp_backward(pp_stage *st, int slot, float dloss, gpt_slab_ready_fn on_slab_ready,
                 void *ctx) {
    gpt_use_slot(st->model, slot);
    if (!st->rep.grads && st->rep.grads16)   /* 16 bits, slab by slab (one whole stage) */
        gpt_backward_grads16(st->model, st->rep.compute, st->rep.grad_precision,
                             st->rep.grads16, dloss, on_slab_ready, ctx);
    else
        gpt_backward(st->model, st->rep.compute, st->rep.grads, dloss, on_slab_ready, ctx);
}

void pp_stage_reduce_tied_grads(pp_stage *st, comm *embedding) {
    if (!embedding || comm_size(embedding) < 2) return;
    comm_allreduce(embedding, gpt_tied_weight(&st->shape, st->rep.grads),
                   gpt_tied_weight_numel(&st->shape), COMM_F32, COMM_SUM);
}

double pp_gather_whole(comm *pp, pp_stage *chunks, int v, pp_vector which, float *whole) {
    gpt_shape unsplit = chunks[0].shape;
    gpt_shape_set_stage(&unsplit, 0, unsplit.cfg.layers);
    const size_t n = gpt_num_params(&unsplit);
    const size_t tied = gpt_tied_weight_numel(&unsplit);
    /* every element is set by exactly one stage and 0 elsewhere, so the sum over the
     * group is exact; the HEAD copy travels beside it to be compared */
    float *sum = mem_alloc(MEM_OTHER, (n + tied) * sizeof(float));
    float *head = sum + n;
    for (int c = 0; c < v; c++) {
        const pp_stage *st = &chunks[c];
        const float *vec = which == PP_PARAMS ? st->rep.params : st->rep.grads;
        for (int slab = 0; slab < gpt_num_slabs(&st->shape); slab++) {
            const int is_head = gpt_slab_kind_of(&st->shape, slab) == GPT_SLAB_HEAD;
            float *to = is_head ? head : sum + gpt_slab_offset(&unsplit,
                                                             gpt_slab_in_whole(&st->shape, slab));
            ops_download(to, vec + gpt_slab_offset(&st->shape, slab),
                         gpt_slab_numel(&st->shape, slab) * sizeof(float));
        }
    }
    comm_allreduce(pp, sum, n + tied, COMM_F32, COMM_SUM);
    double drift = 0;
    if (chunks[0].stages > 1) drift = max_abs_diff(head, sum, tied);   /* sum starts with wte */
    memcpy(whole, sum, n * sizeof(float));
    mem_free(sum);
    return drift;
}
