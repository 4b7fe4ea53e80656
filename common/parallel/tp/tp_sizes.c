/* The sizes tensor parallelism needs of a run, checked before any rank starts, and the
 * vocabulary's split: the heads (hence the width) and the ranks divide by tp, the batch
 * by the data-parallel groups left, and with sequence parallelism the sequence by tp. */
#include "tp_sizes.h"

#include <stdio.h>
#include <string.h>

/* TP sizes that divide the heads (hence the width) and the ranks, with a batch that
 * splits over the remaining data-parallel groups. */
static void sizes_that_work(const run_config *cfg, int world, char *buf, size_t len) {
    buf[0] = '\0';
    for (int t = 1; t <= cfg->model.heads && t <= world; t++) {
        if (cfg->model.heads % t || world % t || cfg->batch % (world / t)) continue;
        snprintf(buf + strlen(buf), len - strlen(buf), "%s%d", buf[0] ? ", " : "", t);
    }
    if (!buf[0]) snprintf(buf, len, "none with %d ranks", world);
}

int tp_check_sizes(const run_config *cfg, int world, int tp, char *err, size_t err_len) {
    const gpt_config *m = &cfg->model;
    const int explicit_tp = tp > 0;
    if (!explicit_tp) tp = world;
    char works[128], what[64];
    sizes_that_work(cfg, world, works, sizeof works);
    if (explicit_tp) snprintf(what, sizeof what, "--tp %d", tp);
    else snprintf(what, sizeof what, "tensor-parallel size %d (the rank count)", tp);
    if (m->heads % tp != 0 || m->dim % tp != 0) {
        /* Only sizes that pass every check here are offered: dividing the heads is not
         * enough when they do not divide the ranks too. */
        char hint[192] = "";
        if (!explicit_tp)   /* TP came from the ranks */
            snprintf(hint, sizeof hint, " (%sor ./run a multiple of a divisor of the %d"
                     " heads)", strncmp(works, "none", 4) ? "give --tp, " : "", m->heads);
        snprintf(err, err_len, "%s does not divide --heads %d (each rank takes heads/tp"
                 " whole heads and dim/tp of --dim %d): TP sizes that work on %d ranks: %s%s",
                 what, m->heads, m->dim, world, works, hint);
        return 0;
    }
    if (world % tp != 0) {
        snprintf(err, err_len, "%s does not divide the %d ranks (ranks = tp x dp): TP"
                 " sizes that work: %s", what, world, works);
        return 0;
    }
    const int dp = world / tp;
    if (cfg->batch % dp != 0) {
        const int some_work = strncmp(works, "none", 4) != 0;
        snprintf(err, err_len, "--batch %d does not split over %d data-parallel groups"
                 " (%d ranks / TP %d): use a batch that is a multiple of %d%s%s",
                 cfg->batch, dp, world, tp, dp, some_work ? ", or TP sizes " : "",
                 some_work ? works : "");
        return 0;
    }
    return 1;
}

void tp_split_vocab(gpt_shape *s, int tp) {
    if (tp > 1) gpt_shape_split_vocab(s);
}

int tp_sequence_check(const run_config *cfg, int tp, char *err, size_t err_len) {
    if (tp < 2) {
        snprintf(err, err_len, "sequence parallelism splits the sequence over the"
                 " tensor-parallel ranks: it needs --tp 2 or more, not %d", tp);
        return 0;
    }
    if (cfg->model.ctx % tp != 0) {
        snprintf(err, err_len, "sequence parallelism with TP %d: --ctx %d does not split"
                 " into %d equal parts of the sequence (use a --ctx that is a multiple of %d)",
                 tp, cfg->model.ctx, tp, tp);
        return 0;
    }
    return 1;
}

int tp_largest_size(const run_config *cfg) {
    char err[256];
    for (int t = cfg->comm.ranks; t > 1; t--)
        if (tp_check_sizes(cfg, cfg->comm.ranks, t, err, sizeof err)) return t;
    return 1;
}
