#include "fits.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "report.h"

double fits_activation_bytes(const gpt_config *m, double sequences) {
    const double T = m->ctx, C = m->dim, H = m->heads, L = m->layers, V = m->vocab;
    const double tokens = sequences * T;
    /* per block: ln1, qkv (3C), atty, x_mid, ln2, fch and fch_gelu (4C each), the block
     * input x: 16C, four LayerNorm statistics, and the attention matrix (H x T a token) */
    const double per_block = 16 * C + 4 + H * T;
    /* final LayerNorm, logits and losses; backward scratch (dx, d_x_mid, d_ln, d_atty,
     * d_qkv, d_att, d_fch, d_fch_gelu) shared by the blocks; tokens and targets */
    const double once = (2 * C + 3 + V) + (14 * C + H * T) + 2;
    return 4.0 * tokens * (L * per_block + once);
}

static double params_of(const gpt_config *m) {
    const double C = m->dim, L = m->layers;
    return (double)m->vocab * C + (double)m->ctx * C + L * (12 * C * C + 13 * C) + 2 * C;
}

/* Model state per parameter: fp32 params, grads, m, v; in mixed precision 16-bit
 * compute weights, fp32 grads, and masters, m, v (2 + 4 + 12). */
static double state_bytes_per_param(precision p) { return p == PRECISION_FP32 ? 16 : 18; }

/* The estimate for a baseline of `params` and ranks holding `params_per_rank` each. */
static double estimate_bytes(const run_config *cfg, int ranks_here, double params,
                             double params_per_rank) {
    const double per_param = state_bytes_per_param(cfg->precision);
    /* 16-bit activations: half (at least: the fp32 statistics count as 16-bit here) */
    const double acts = fits_activation_bytes(&cfg->model, cfg->batch) *
                        (double)precision_bytes(cfg->precision) / 4.0;
    const double ranks = cfg->comm.ranks > 0 ? cfg->comm.ranks : 1;
    return per_param * (params + ranks_here * params_per_rank) + acts * (1 + ranks_here / ranks);
}

double fits_estimate_bytes(const run_config *cfg, int ranks_here, double model_share_per_rank) {
    const double params = params_of(&cfg->model);
    return estimate_bytes(cfg, ranks_here, params, params * model_share_per_rank);
}

/* cgroup v2's memory.max, when it holds a number ("max" means none). */
static double cgroup_limit_bytes(void) {
    FILE *f = fopen("/sys/fs/cgroup/memory.max", "r");
    double limit = 0;
    if (f) {
        if (fscanf(f, "%lf", &limit) != 1) limit = 0;
        fclose(f);
    }
    return limit;
}

double fits_machine_bytes(void) {
    const double physical = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGE_SIZE);
    const double limit = cgroup_limit_bytes();
    return limit > 0 && limit < physical ? limit : physical;
}

static int ranks_on_this_machine(const run_config *cfg) {
    if (launch_mpi_local_size() > 0) return launch_mpi_local_size();
    return cfg->comm.ranks;
}

void fits_check_params_or_exit(const run_config *cfg, double params, double params_per_rank) {
    const gpt_config *m = &cfg->model;
    /* Token indices are ints: a batch's tokens must be counted by one. */
    if ((double)cfg->batch * m->ctx > INT_MAX)
        cli_fail("--batch %d x --ctx %d = %.0f tokens a step: more than %d", cfg->batch,
                 m->ctx, (double)cfg->batch * m->ctx, INT_MAX);
    const double needed = estimate_bytes(cfg, ranks_on_this_machine(cfg), params,
                                         params_per_rank);
    const double have = fits_machine_bytes();
    if (needed > have) {
        char a[32], b[32];
        cli_fail("this run needs at least %s of memory (%.3g parameters x %.0f B of model"
                 " state, and activations for --batch %d x --ctx %d, on %d rank%s), and this"
                 " machine has %s: use a smaller model, batch or fewer ranks",
                 report_bytes(needed, a), params, state_bytes_per_param(cfg->precision),
                 cfg->batch, m->ctx, cfg->comm.ranks,
                 cfg->comm.ranks == 1 ? "" : "s", report_bytes(have, b));
    }
}

void fits_check_or_exit(const run_config *cfg, double model_share_per_rank) {
    const double params = params_of(&cfg->model);
    fits_check_params_or_exit(cfg, params, params * model_share_per_rank);
}
