/* Part memory: activation bytes per layer per rank of six configurations, measured by
 * the allocator's MEM_ACTIVATIONS tag, next to Korthikanti et al. 2022's Table 2
 * re-derived for this model (activation_memory.h) and the paper's own numbers.
 *
 * Measured: one rank's model of 2 blocks and of 1 block, each through one forward and
 * backward; the difference of their activation peaks is one layer's, with everything a
 * model holds once (embedding output, the head's logits, backward scratch, SP's
 * gathered buffers, the one block recomputed) cancelled out. */
#include <stdlib.h>

#include "alloc.h"
#include "comm.h"
#include "ops.h"
#include "ops_mixed.h"
#include "report.h"
#include "sequence.h"

const char *const memory_setup_names[MEMORY_SETUPS] = {
    "none", "TP", "TP + SP", "TP + selective", "TP + SP + selective", "full recompute"};

void memory_setups(int tp, activation_setup out[MEMORY_SETUPS]) {
    out[0] = (activation_setup){1, 0, RECOMPUTE_NONE};
    out[1] = (activation_setup){tp, 0, RECOMPUTE_NONE};
    out[2] = (activation_setup){tp, 1, RECOMPUTE_NONE};
    out[3] = (activation_setup){tp, 0, RECOMPUTE_SELECTIVE};
    out[4] = (activation_setup){tp, 1, RECOMPUTE_SELECTIVE};
    out[5] = (activation_setup){1, 0, RECOMPUTE_FULL};
}

/* The compute copy of shape s's initial parameters, on the device. */
static void *initial_params(const gpt_shape *s, const run_config *cfg) {
    const size_t n = gpt_num_params(s);
    float *host = mem_alloc(MEM_OTHER, n * sizeof(float));
    gpt_init_params(s, cfg->seed, 0, n, host);
    float *master = mem_alloc_on(MEM_DEVICE, MEM_OTHER, n * sizeof(float));
    ops_upload(master, host, n * sizeof(float));
    void *params = mem_alloc_on(MEM_DEVICE, MEM_PARAMS, n * precision_bytes(cfg->precision));
    mixed_round(cfg->precision, params, master, n);   /* fp32: a copy */
    mem_free(master);
    mem_free(host);
    return params;
}

/* Tokens of a pattern: the bytes are the same for any tokens. */
static void set_some_batch(gpt_model *model, int B, int T, int vocab) {
    int *batch = gpt_host_batch(model);
    for (int i = 0; i < 2 * B * T; i++) batch[i] = (i * 7 + 3) % vocab;
    gpt_set_batch(model, batch, batch + B * T);
}

double memory_peak_activations(comm *tp, const run_config *cfg, activation_setup c, int B,
                               int layers) {
    gpt_config m = cfg->model;
    m.layers = layers;
    gpt_shape s = gpt_shape_make(&m, c.tp, c.tp > 1 ? comm_rank(tp) : 0);
    tp_split_vocab(&s, c.tp);
    void *params = initial_params(&s, cfg);
    float *grads = mem_alloc_on(MEM_DEVICE, MEM_GRADS, gpt_num_params(&s) * sizeof(float));
    mem_stats *stats = mem_stats_current();
    const size_t before = stats->current[MEM_ACTIVATIONS];
    mem_stats_reset_peaks(stats);
    const gpt_model_options opts = {
        .tp = c.tp > 1 ? tp : NULL, .precision = cfg->precision, .sequence_parallel = c.sp,
        .recompute_attention = c.recompute == RECOMPUTE_SELECTIVE,
        .checkpoint_activations = c.recompute == RECOMPUTE_FULL};
    gpt_model *model = gpt_model_create(&s, B, m.ctx, &opts);
    set_some_batch(model, B, m.ctx, m.vocab);
    gpt_forward(model, params);
    gpt_backward(model, params, grads, 1.0f / ((float)B * m.ctx), NULL, NULL);
    const double peak = (double)(stats->peak[MEM_ACTIVATIONS] - before);
    gpt_model_free(model);
    mem_free(grads);
    mem_free(params);
    return peak;
}

typedef struct {
    const run_config *cfg;
    memory_report *r;
} memory_args;

/* Every setup on the first tp ranks (the others wait); world rank 0 keeps the numbers. */
static int memory_rank(comm *world, void *argp) {
    memory_args *a = argp;
    memory_report *r = a->r;
    const int in_group = comm_rank(world) < r->tp;
    comm *tp = comm_split(world, in_group ? 0 : -1, comm_rank(world), "tp");
    for (int i = 0; i < MEMORY_SETUPS && in_group; i++) {
        const activation_setup c = r->setup[i];
        if (c.tp == 1 && comm_rank(world) != 0) continue;   /* one rank's model */
        const double per_layer = memory_peak_activations(tp, a->cfg, c, r->B, 2) -
                                 memory_peak_activations(tp, a->cfg, c, r->B, 1);
        if (comm_rank(world) == 0) r->measured[i] = per_layer;
    }
    if (tp) comm_free(tp);
    comm_barrier(world);
    return 0;
}

int memory_launches(const run_config *cfg, int tp, memory_report *r) {
    *r = (memory_report){.tp = tp, .B = cfg->batch, .model = cfg->model,
                         .precision = cfg->precision};
    memory_setups(tp, r->setup);
    for (int i = 0; i < MEMORY_SETUPS; i++) {
        r->derived[i] = activation_bytes_per_layer(&cfg->model, r->B, cfg->precision,
                                                   r->setup[i]);
        r->paper[i] = activation_bytes_paper(&cfg->model, r->B, r->setup[i]);
    }
    memory_args args = {cfg, r};
    return launch(&cfg->comm, memory_rank, &args);
}

int memory_passed(const memory_report *r) {
    for (int i = 0; i < MEMORY_SETUPS; i++)
        if (r->measured[i] != r->derived[i]) return 0;
    return 1;
}
