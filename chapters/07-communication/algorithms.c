/* Part 2: ring, naive and recursive doubling on the modelled wire, for message sizes
 * from 1 KiB up, each measured beside its alpha-beta prediction (plan_time.c):
 *   ring       2 (N-1) alpha + 2 (N-1)/N n beta     bandwidth-optimal
 *   naive      N (alpha + n beta)                    rank 0 does all the adding
 *   doubling   ceil-ish log2 N (alpha + n beta)      latency-optimal
 * Small messages pay alpha per step, so the fewest steps win; large ones pay n beta
 * per step, so the fewest bytes win. NCCL picks between a tree and a ring for that. */
#include "communication.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

const char *algorithm_name(comm_allreduce_algo algo) {
    static const char *names[] = {"ring", "naive", "doubling"};
    return (int)algo >= 0 && (int)algo < (int)ALGORITHMS ? names[algo] : "?";
}

double predict_allreduce(comm_allreduce_algo algo, plan_link link, int ranks, double bytes) {
    switch (algo) {
    case ALLREDUCE_NAIVE: return plan_allreduce_naive_seconds(link, ranks, bytes);
    case ALLREDUCE_DOUBLING: return plan_allreduce_doubling_seconds(link, ranks, bytes);
    default: return plan_allreduce_seconds(link, ranks, bytes);
    }
}

/* ---- measuring: every rank times each repetition; the collective's time is the last
 * exit minus the first entry (all ranks share this process: threads backend) ---------- */
enum { MAX_REPS = 15 };

typedef struct {
    const size_t *bytes;
    int nsizes;
    double *measured_s;
    double (*starts)[MAX_REPS], (*ends)[MAX_REPS];   /* [ranks][reps] for one size */
} measure_args;

/* Fewer repetitions where one takes long: the median of 15, 5 or 3. */
static int repetitions(size_t bytes) {
    return bytes <= (64u << 10) ? 15 : bytes <= (4u << 20) ? 5 : 3;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_span(double (*starts)[MAX_REPS], double (*ends)[MAX_REPS], int ranks,
                          int reps) {
    double spans[MAX_REPS];
    for (int k = 0; k < reps; k++) {
        double first = starts[0][k], last = ends[0][k];
        for (int r = 1; r < ranks; r++) {
            if (starts[r][k] < first) first = starts[r][k];
            if (ends[r][k] > last) last = ends[r][k];
        }
        spans[k] = last - first;
    }
    qsort(spans, (size_t)reps, sizeof *spans, compare_doubles);
    return spans[reps / 2];
}

static int measure_main(comm *world, void *argp) {
    measure_args *a = argp;
    const int r = comm_rank(world), n = comm_size(world);
    size_t largest = 0;
    for (int i = 0; i < a->nsizes; i++) if (a->bytes[i] > largest) largest = a->bytes[i];
    float *buf = mem_alloc(MEM_COMM, largest);
    memset(buf, 0, largest);
    for (int i = 0; i < a->nsizes; i++) {
        const int reps = repetitions(a->bytes[i]);
        comm_allreduce(world, buf, a->bytes[i] / sizeof(float), COMM_F32, COMM_SUM);  /* warm */
        for (int k = 0; k < reps; k++) {
            comm_barrier(world);
            a->starts[r][k] = comm_now();
            comm_allreduce(world, buf, a->bytes[i] / sizeof(float), COMM_F32, COMM_SUM);
            a->ends[r][k] = comm_now();
        }
        comm_barrier(world);   /* every rank's times are in */
        if (r == 0) a->measured_s[i] = median_span(a->starts, a->ends, n, reps);
        comm_barrier(world);
    }
    mem_free(buf);
    return 0;
}

int measure_allreduces(const comm_options *wire, comm_allreduce_algo algo, int ranks,
                       const size_t *bytes, int nsizes, double *measured_s) {
    comm_options o = *wire;
    o.ranks = ranks;
    o.allreduce = algo;
    o.trace_path = NULL;
    measure_args a = {.bytes = bytes, .nsizes = nsizes, .measured_s = measured_s,
                      .starts = calloc((size_t)ranks, sizeof *a.starts),
                      .ends = calloc((size_t)ranks, sizeof *a.ends)};
    if (!a.starts || !a.ends) { fprintf(stderr, "out of memory\n"); exit(1); }
    int status = launch_threads(&o, measure_main, &a);
    free(a.starts);
    free(a.ends);
    return status;
}

/* ---- the sweep --------------------------------------------------------------------------- */
int algorithms_sweep(const comm_options *wire, const int *ranks, int nranks,
                     size_t max_bytes, algo_sweep *out) {
    size_t sizes[16];
    int nsizes = 0;
    for (size_t b = 1024; b <= max_bytes && nsizes < 16; b *= 4) sizes[nsizes++] = b;
    *out = (algo_sweep){.link = wire->link, .link_scale = wire->link_scale,
                        .points = calloc((size_t)(nsizes * nranks * ALGORITHMS),
                                         sizeof *out->points)};
    if (!out->points) { fprintf(stderr, "out of memory\n"); exit(1); }
    const plan_link link = plan_link_scaled(plan_link_of(wire->link), wire->link_scale);
    double measured[16];
    for (int k = 0; k < nranks; k++)
        for (int algo = 0; algo < ALGORITHMS; algo++) {
            int status = measure_allreduces(wire, (comm_allreduce_algo)algo, ranks[k], sizes,
                                            nsizes, measured);
            if (status) return status;
            for (int i = 0; i < nsizes; i++)
                out->points[out->count++] = (algo_point){
                    .algo = (comm_allreduce_algo)algo, .ranks = ranks[k], .bytes = sizes[i],
                    .measured_s = measured[i],
                    .predicted_s = predict_allreduce((comm_allreduce_algo)algo, link,
                                                     ranks[k], (double)sizes[i])};
        }
    return 0;
}

void algo_sweep_free(algo_sweep *s) {
    free(s->points);
    s->points = NULL;
    s->count = 0;
}

static const algo_point *find_point(const algo_sweep *s, int algo, int ranks, size_t bytes) {
    for (int i = 0; i < s->count; i++)
        if ((int)s->points[i].algo == algo && s->points[i].ranks == ranks &&
            s->points[i].bytes == bytes)
            return &s->points[i];
    return NULL;
}

/* One row per (N, size): the three algorithms measured / predicted, and the winners. */
static void print_row(const algo_sweep *s, int ranks, size_t bytes) {
    int best_measured = 0, best_predicted = 0;
    if (bytes >= (1u << 20)) printf("  %2d  %5zu MiB", ranks, bytes >> 20);
    else printf("  %2d  %5zu KiB", ranks, bytes >> 10);
    for (int algo = 0; algo < ALGORITHMS; algo++) {
        const algo_point *p = find_point(s, algo, ranks, bytes);
        const algo_point *bm = find_point(s, best_measured, ranks, bytes);
        const algo_point *bp = find_point(s, best_predicted, ranks, bytes);
        if (p->measured_s < bm->measured_s) best_measured = algo;
        if (p->predicted_s < bp->predicted_s) best_predicted = algo;
        printf("  %9.3f / %9.3f", 1e3 * p->measured_s, 1e3 * p->predicted_s);
    }
    printf("   %-8s %-8s\n", algorithm_name(best_measured), algorithm_name(best_predicted));
}

void algorithms_print(const algo_sweep *s) {
    static const char *link_names[] = {"none", "nvlink", "ib", "ethernet"};
    printf("\nAll-reduce algorithms on --link %s x %g: ms measured / predicted (alpha-beta)\n",
           link_names[s->link], s->link_scale);
    printf("   N       size         ring (ms)            naive (ms)         doubling (ms)"
           "    fastest: measured, predicted\n");
    int last_ranks = -1;
    for (int i = 0; i < s->count; i++) {
        const algo_point *p = &s->points[i];
        if (p->algo != ALLREDUCE_RING) continue;
        if (last_ranks >= 0 && p->ranks != last_ranks) printf("\n");
        last_ranks = p->ranks;
        print_row(s, p->ranks, p->bytes);
    }
    printf("  ring 2(N-1) alpha + 2(N-1)/N n beta; naive N (alpha + n beta): rank 0 adds the"
           " others one by one,\n  then all copy back at once; doubling (log2 P + 2 [N != P])"
           " (alpha + n beta), P = 2^floor(log2 N).\n");
}
