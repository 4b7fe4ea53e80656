/* launch(): runs a rank_main on every rank. Threads: N threads of this process, each
 * with its own memory accounting; MPI: the processes mpirun started (comm_mpi.c).
 *
 * Devices (GPU=1): every rank selects its device on its own thread before rank_main,
 * rank r of a process GPU r % GPUs. With a GPU for every rank the communicator is
 * NCCL; with more ranks than GPUs the ranks share them through the threads backend,
 * which then moves device buffers (comm_threads.c, gpu/comm_gpu.c). */
#include "comm_internal.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"

/* How long ranks get to notice a failure before the process gives up on them: a rank
 * stops at its next comm call, so only one busy outside comm takes this long. */
#define STOP_GRACE_SECONDS 10.0

/* mpirun's environment: the only place that reads it. */
static int mpi_env(const char *name) {
    const char *value = getenv(name);
    return value ? atoi(value) : 0;
}

int launch_mpi_world_size(void) { return mpi_env("OMPI_COMM_WORLD_SIZE"); }
int launch_mpi_world_rank(void) { return mpi_env("OMPI_COMM_WORLD_RANK"); }
int launch_mpi_local_size(void) { return mpi_env("OMPI_COMM_WORLD_LOCAL_SIZE"); }
int process_hosts_rank0(void) { return launch_mpi_world_rank() == 0; }

/* One OpenBLAS thread per rank: the ranks are the parallelism. */
static void one_blas_thread(void) {
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    openblas_set_num_threads(1);
}

/* ---- devices -------------------------------------------------------------------------- */
device_kind launch_select_device(const comm_options *opts, int index) {
    return device_select_for_rank(opts->device, opts->tf32, index);
}

/* NCCL needs a GPU of its own for every rank of the process. */
static int nccl_fits(const comm_options *opts, int local_ranks) {
    return device_resolve(opts->device) == DEVICE_CUDA && local_ranks <= device_gpu_count();
}

/* "device: cpu", with the reason when a GPU build found no GPU to run on. */
static void describe_cpu(int mpi, char *out, size_t size) {
    const char *communicator = mpi ? "mpi (ranks are Open MPI processes)"
                                   : "threads (ranks are threads of this process)";
    char why[160] = "";
    if (device_gpu_backend() && device_gpu_count() == 0) {
        device_no_gpu_reason(why, sizeof why);
        snprintf(out, size, "device: cpu (no GPU visible: running on the CPU, as CUDA says: %s);"
                 " communicator: %s", why, communicator);
        return;
    }
    snprintf(out, size, "device: cpu; communicator: %s", communicator);
}

/* Whether launch() will run MPI processes, and how many ranks share this node's GPUs
 * (the processes mpirun started here, or every thread rank). */
static int ranks_on_this_node(int world, int *mpi) {
    *mpi = 0;
    int local = world;
#ifdef USE_MPI
    *mpi = launch_mpi_world_size() > 0;
    if (*mpi && launch_mpi_local_size() > 0) local = launch_mpi_local_size();
#endif
    return local;
}

void launch_describe(const comm_options *opts, int world, char *out, size_t size) {
    int mpi;
    const int local = ranks_on_this_node(world, &mpi);
    if (device_resolve(opts->device) != DEVICE_CUDA) {
        describe_cpu(mpi, out, size);
        return;
    }
    const int gpus = device_gpu_count();
    char name[96] = "no GPU visible";
    if (gpus > 0) device_gpu_name(0, name, sizeof name);
    char communicator[160];
    if (nccl_fits(opts, local))
        snprintf(communicator, sizeof communicator, "nccl (one GPU per rank, %s)",
                 mpi ? "processes; the id sent with MPI_Bcast" : "threads of this process");
    else if (mpi)
        snprintf(communicator, sizeof communicator, "mpi over shared GPUs (%d ranks per node"
                 " on %d GPU%s: device buffers staged through the host)", local, gpus,
                 gpus == 1 ? "" : "s");
    else
        snprintf(communicator, sizeof communicator, "threads over a shared GPU (%d ranks on"
                 " %d GPU%s: device copies and reduction kernels)", world, gpus,
                 gpus == 1 ? "" : "s");
    snprintf(out, size, "device: cuda (%d GPU%s: %s%s); communicator: %s", gpus,
             gpus == 1 ? "" : "s", name, opts->tf32 ? ", TF32 matmuls" : "", communicator);
}

const char *launch_backend_name(const comm_options *opts, int world) {
    int mpi;
    if (nccl_fits(opts, ranks_on_this_node(world, &mpi))) return "nccl";
    return mpi ? "mpi" : "threads";
}

/* ---- launching ---------------------------------------------------------------------- */
/* ./run's question before an elastic restart: does the program accept this many ranks?
 * Every check of the flags and the layout runs before the first launch, so reaching it
 * means yes (exit 0), and a refusal is their exit 2. */
static void answer_layout_probe(void) {
    if (getenv("RUN_LAYOUT_PROBE")) exit(0);
}

int launch(const comm_options *opts, rank_main_fn fn, void *args) {
    answer_layout_probe();
#ifdef USE_MPI
    if (launch_mpi_world_size() > 0) return launch_mpi(opts, fn, args);
#endif
    return launch_threads(opts, fn, args);
}

int launch_mpi(const comm_options *opts, rank_main_fn fn, void *args) {
#ifdef USE_MPI
    one_blas_thread();
    return mpi_launch(opts, fn, args);
#else
    (void)opts, (void)fn, (void)args;
    fprintf(stderr, "error: this build has no MPI support (rebuild with MPI=1)\n");
    return 2;
#endif
}

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int finished;
} launch_state;

typedef struct {
    comm_job *job;
    int index;
    comm *world;          /* threads: made before the start; NCCL: by the rank */
    const unsigned char *nccl_id;   /* NULL: the threads backend */
    rank_main_fn fn;
    void *args;
    launch_state *state;
    pthread_t thread;
    int status;
} rank_thread;

static void *rank_thread_main(void *arg) {
    rank_thread *rt = arg;
    comm_rank_state *rs = &rt->job->ranks[rt->index];
    mem_stats_bind(&rs->mem);
    launch_select_device(&rt->job->opts, rt->index);
    if (rt->nccl_id) {   /* every rank thread joins at once: ncclCommInitRank waits */
        rt->world = nccl_world(rt->job, rs, rt->index, rt->job->nranks, rt->nccl_id);
        rt->status = nccl_run_rank(rt->world, rt->fn, rt->args);
    } else {
        rt->status = threads_run_rank(rt->world, rt->fn, rt->args);
    }
    atomic_store(&rs->status, rt->status);
    atomic_store(&rs->finished, 1);
    pthread_mutex_lock(&rt->state->lock);
    rt->state->finished++;
    pthread_cond_signal(&rt->state->changed);
    pthread_mutex_unlock(&rt->state->lock);
    return NULL;
}

/* Waits for every rank; after a failure, gives them STOP_GRACE_SECONDS. */
static void wait_for_ranks(comm_job *job, launch_state *state, int n) {
    double stop_seen = 0;
    pthread_mutex_lock(&state->lock);
    while (state->finished < n) {
        struct timespec later;
        clock_gettime(CLOCK_REALTIME, &later);
        later.tv_nsec += 100 * 1000 * 1000;
        if (later.tv_nsec >= 1000000000L) { later.tv_sec++; later.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&state->changed, &state->lock, &later);
        if (!comm_job_stopping(job)) continue;
        if (stop_seen == 0) stop_seen = comm_now();
        if (comm_now() - stop_seen > STOP_GRACE_SECONDS) {
            for (int r = 0; r < n; r++)
                if (!atomic_load(&job->ranks[r].finished))
                    fprintf(stderr, "comm: rank %d has not stopped %.0f s after the failure "
                            "(busy outside comm); exiting\n", r, STOP_GRACE_SECONDS);
            exit(comm_job_exit_status(job));
        }
    }
    pthread_mutex_unlock(&state->lock);
}

int launch_threads(const comm_options *opts, rank_main_fn fn, void *args) {
    comm_options defaults = comm_options_default();
    if (!opts) opts = &defaults;
    int n = opts->ranks;
    if (n < 1 || n > THREADS_MAX_RANKS) {
        fprintf(stderr, "error: %d ranks: the threads backend runs 1 to %d\n", n,
                THREADS_MAX_RANKS);
        return 2;
    }
    one_blas_thread();

    comm_job *job = comm_job_create(opts, n, 0);
    const unsigned char *nccl_id = NULL;
    unsigned char id[NCCL_ID_BYTES];
    if (nccl_fits(opts, n)) {
        nccl_unique_id(id);
        nccl_id = id;
    }
    if (!nccl_id) threads_job_init(job);
    launch_state state = {.finished = 0};
    pthread_mutex_init(&state.lock, NULL);
    pthread_cond_init(&state.changed, NULL);
    rank_thread *ranks = calloc((size_t)n, sizeof *ranks);
    if (!ranks) { fprintf(stderr, "comm: out of memory\n"); exit(1); }
    for (int r = 0; r < n; r++)
        ranks[r] = (rank_thread){.job = job, .index = r,
                                 .world = nccl_id ? NULL : threads_world(job, r),
                                 .nccl_id = nccl_id, .fn = fn, .args = args,
                                 .state = &state};
    for (int r = 0; r < n; r++)
        if (pthread_create(&ranks[r].thread, NULL, rank_thread_main, &ranks[r])) {
            fprintf(stderr, "error: cannot start the thread of rank %d\n", r);
            exit(1);
        }
    wait_for_ranks(job, &state, n);
    for (int r = 0; r < n; r++) pthread_join(ranks[r].thread, NULL);

    int status = 0;
    for (int r = 0; r < n && !status; r++) status = ranks[r].status;
    if (status < 0 || (atomic_load(&job->failed) && status == 0))
        status = comm_job_exit_status(job);
    if (job->opts.trace_path) {
        char **parts = calloc((size_t)n, sizeof *parts);
        for (int r = 0; parts && r < n; r++) parts[r] = comm_trace_rank_json(job, &job->ranks[r]);
        if (!parts || comm_trace_write(job->opts.trace_path, parts, n)) status = status ? status : 1;
        for (int r = 0; parts && r < n; r++) free(parts[r]);
        free(parts);
    }
    if (nccl_id) comm_job_free(job);   /* NCCL groups: torn down from this thread */
    else threads_job_free(job);
    free(ranks);
    pthread_mutex_destroy(&state.lock);
    pthread_cond_destroy(&state.changed);
    return status;
}
