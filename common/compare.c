#include "compare.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void compare_to_baseline(run_result *r, const baseline_run *b, const float *loss,
                         const float *first_grads, const float *final_params) {
    r->diff_loss = loss ? max_abs_diff(loss, b->loss, (size_t)r->steps) : -1;
    r->diff_grads = first_grads ? max_abs_diff(first_grads, b->first_grads, b->num_params) : -1;
    r->diff_params = final_params ? max_abs_diff(final_params, b->final_params, b->num_params) : -1;
}

double run_worst_fraction_of_tolerance(const run_result *r, double tol_grads,
                                       double tol_loss, double tol_params) {
    const double diffs[3] = {r->diff_grads, r->diff_loss, r->diff_params};
    const double tols[3] = {tol_grads, tol_loss, tol_params};
    double worst = 0;
    for (int i = 0; i < 3; i++) {
        if (tols[i] <= 0) continue;
        if (isnan(diffs[i])) return INFINITY;
        if (diffs[i] >= 0 && diffs[i] / tols[i] > worst) worst = diffs[i] / tols[i];
    }
    return worst;
}

/* The measurements that are maximised over ranks, packed as doubles. */
enum { M_SECONDS, M_COMM, M_COMM_LEAST, M_HIDDEN, M_BYTES, M_PEAK0,
       M_COUNT = M_PEAK0 + MEM_NTAGS + 1 };

void run_result_take_max(comm *group, run_result *r) {
    const int n = comm_size(group);
    double mine[M_COUNT];
    mine[M_SECONDS] = r->seconds;
    mine[M_COMM] = r->comm_seconds;
    mine[M_COMM_LEAST] = -r->comm_seconds;   /* the largest of minus: the least */
    mine[M_HIDDEN] = r->hidden_seconds;
    mine[M_BYTES] = r->bytes_sent_per_step;
    for (int t = 0; t < MEM_NTAGS; t++) mine[M_PEAK0 + t] = (double)r->memory.peak[t];
    mine[M_PEAK0 + MEM_NTAGS] = (double)r->memory.peak_total;
    /* doubles travel as pairs of f32 words: all-gather only copies, never adds */
    double *all = malloc(sizeof mine * (size_t)n);
    comm_allgather(group, mine, all, (size_t)n * 2 * M_COUNT, COMM_F32);
    for (int k = 0; k < n; k++)
        for (int i = 0; i < M_COUNT; i++)
            if (all[k * M_COUNT + i] > mine[i]) mine[i] = all[k * M_COUNT + i];
    free(all);
    r->seconds = mine[M_SECONDS];
    r->comm_seconds = mine[M_COMM];
    r->comm_seconds_least = -mine[M_COMM_LEAST];
    r->hidden_seconds = mine[M_HIDDEN];
    r->bytes_sent_per_step = mine[M_BYTES];
    for (int t = 0; t < MEM_NTAGS; t++) r->memory.peak[t] = (size_t)mine[M_PEAK0 + t];
    r->memory.peak_total = (size_t)mine[M_PEAK0 + MEM_NTAGS];
}

void run_result_add_comm(run_result *r, comm *world, int steps) {
    comm_stats s = comm_stats_all(world);
    r->comm_seconds = comm_stats_total_seconds(&s);
    r->hidden_seconds = s.hidden_seconds;
    r->bytes_sent_per_step = steps > 0 ? (double)comm_stats_total_sent(&s) / steps : 0;
}

int process_hosts_rank0(void) {
    const char *rank = getenv("OMPI_COMM_WORLD_RANK");
    return !rank || strcmp(rank, "0") == 0;
}
