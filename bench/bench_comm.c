/* All-reduce bus bandwidth, as nccl-tests defines it: algbw = bytes / time, busbw =
 * algbw * 2(N-1)/N (the rate each rank's link runs at in a ring). Prints one table.
 *
 *   bench_comm [max_mib]                 threads backend: ring, naive and recursive
 *                                        doubling, 2 and 4 ranks, next to memcpy on
 *                                        this machine
 *   mpirun -np N bench_comm [max_mib]    (MPI=1 build) Open MPI's MPI_Allreduce and
 *                                        this project's comm over MPI, N ranks
 * Time = the slowest rank's, best of 3 repetitions. fp32 sum, in place. */
#include "comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef USE_MPI
#include <mpi.h>
#endif

#define MIN_BYTES ((size_t)1 << 10)
#define MAX_SIZES 16

typedef struct {
    size_t max_bytes;
    int raw_mpi;                 /* time MPI_Allreduce itself instead of comm_allreduce */
    double busbw[MAX_SIZES];     /* GB/s, filled by rank 0 */
} bench;

static int iterations(size_t bytes) {
    size_t n = ((size_t)256 << 20) / bytes;
    return n < 3 ? 3 : n > 2000 ? 2000 : (int)n;
}

static double memcpy_gbps(size_t bytes) {
    /* Page-aligned: two mallocs can land a few bytes apart modulo 4 KiB, which slows
     * rep movsb on some CPUs and would understate memcpy. */
    size_t size = (bytes + 4095) & ~(size_t)4095;
    char *a = aligned_alloc(4096, size), *b = aligned_alloc(4096, size);
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    int iters = iterations(bytes);
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = comm_now();
        for (int i = 0; i < iters; i++) {
            memcpy(b, a, bytes);
            __asm__ volatile("" ::"r"(b) : "memory");
        }
        double t = (comm_now() - t0) / iters;
        if (t < best) best = t;
    }
    free(a);
    free(b);
    return (double)bytes / best / 1e9;
}

static void allreduce(comm *c, float *x, size_t count, int raw_mpi) {
#ifdef USE_MPI
    if (raw_mpi) {
        MPI_Allreduce(MPI_IN_PLACE, x, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        return;
    }
#endif
    (void)raw_mpi;
    comm_allreduce(c, x, count, COMM_F32, COMM_SUM);
}

static int rank_main(comm *world, void *arg) {
    bench *b = arg;
    int n = comm_size(world), row = 0;
    float *x = mem_alloc(MEM_COMM, b->max_bytes);
    for (size_t bytes = MIN_BYTES; bytes <= b->max_bytes; bytes *= 4, row++) {
        size_t count = bytes / sizeof(float);
        int iters = iterations(bytes);
        float best = 1e30f;
        allreduce(world, x, count, b->raw_mpi);   /* warm up */
        for (int rep = 0; rep < 3; rep++) {
            comm_barrier(world);
            double t0 = comm_now();
            for (int i = 0; i < iters; i++) allreduce(world, x, count, b->raw_mpi);
            float t = (float)((comm_now() - t0) / iters);
            comm_allreduce(world, &t, 1, COMM_F32, COMM_MAX);   /* the slowest rank */
            if (t < best) best = t;
        }
        if (comm_rank(world) == 0) b->busbw[row] = (double)bytes / best / 1e9 * 2 * (n - 1) / n;
    }
    mem_free(x);
    return 0;
}

static void size_label(size_t bytes, char *out, size_t n) {
    if (bytes >= ((size_t)1 << 20)) snprintf(out, n, "%zu MiB", bytes >> 20);
    else snprintf(out, n, "%zu KiB", bytes >> 10);
}

int main(int argc, char **argv) {
    size_t max_mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 64;
    if (max_mib < 1 || max_mib > 4096) {
        fprintf(stderr, "error: max_mib %zu: use 1 to 4096\n", max_mib);
        return 2;
    }
    size_t max_bytes = max_mib << 20;
    int rows = 0;
    for (size_t bytes = MIN_BYTES; bytes <= max_bytes; bytes *= 4) rows++;
    comm_options opts = comm_options_default();

    if (launch_mpi_world_size() > 0) {
        bench raw = {.max_bytes = max_bytes, .raw_mpi = 1}, ours = {.max_bytes = max_bytes};
        int status = launch(&opts, rank_main, &ours);
        status |= launch(&opts, rank_main, &raw);
        if (ours.busbw[0] > 0) {   /* rank 0 prints */
            printf("all-reduce bus bandwidth, GB/s (fp32 sum), %d MPI ranks\n",
                   launch_mpi_world_size());
            printf("%8s %10s %16s %16s\n", "size", "memcpy", "MPI_Allreduce", "comm over MPI");
            size_t bytes = MIN_BYTES;
            for (int i = 0; i < rows; i++, bytes *= 4) {
                char label[32];
                size_label(bytes, label, sizeof label);
                printf("%8s %10.2f %16.2f %16.2f\n", label, memcpy_gbps(bytes), raw.busbw[i],
                       ours.busbw[i]);
            }
        }
        return status;
    }

    static const int world_sizes[] = {2, 4};
    static const comm_allreduce_algo algos[] = {ALLREDUCE_RING, ALLREDUCE_NAIVE,
                                                ALLREDUCE_DOUBLING};
    bench runs[6];
    for (int w = 0; w < 2; w++)
        for (int algo = 0; algo < 3; algo++) {
            bench *b = &runs[3 * w + algo];
            *b = (bench){.max_bytes = max_bytes};
            opts.ranks = world_sizes[w];
            opts.allreduce = algos[algo];
            if (launch(&opts, rank_main, b)) return 1;
        }
    printf("all-reduce bus bandwidth, GB/s (fp32 sum), threads backend, no link model\n");
    printf("%8s %10s", "size", "memcpy");
    for (int w = 0; w < 2; w++)
        printf(" %11s%d %11s%d %11s%d", "ring N=", world_sizes[w], "naive N=", world_sizes[w],
               "doubling N=", world_sizes[w]);
    printf("\n");
    size_t bytes = MIN_BYTES;
    for (int i = 0; i < rows; i++, bytes *= 4) {
        char label[32];
        size_label(bytes, label, sizeof label);
        printf("%8s %10.2f", label, memcpy_gbps(bytes));
        for (int k = 0; k < 6; k++) printf(" %12.2f", runs[k].busbw[i]);
        printf("\n");
    }
    return 0;
}
