/* Internals shared by the comm front end (comm_api.c) and its backends.
 *
 * The front end owns everything that does not depend on how bytes move: argument
 * checks and sequence numbers (comm_api.c), calls and their descriptions
 * (comm_call.c), jobs, ranks and groups (comm_job.c), the wire's element types
 * (comm_codec.c), the flight recorder and failure reports (comm_failure.c),
 * accounting and the trace (comm_accounting.c). A backend only moves bytes, behind the comm_backend table below.
 *
 * Adding a backend (e.g. NCCL in gpu/, reached through comm_gpu_hooks below):
 *   1. Write the functions of a comm_backend (all are required) and one static table.
 *   2. At launch, make a job with comm_job_create(), and for each rank of this process
 *      its world comm with comm_create(); keep your state in comm->impl (and, if
 *      useful, in job->impl / comm_rank_state.impl).
 *   3. Bytes: either call comm_count() with what each copy really moved (threads), or
 *      set bytes_modelled = 1 and comm_accounting.c counts the textbook ring volume
 *      (MPI, NCCL).
 *   4. Never block forever: when a wait passes job->opts.timeout_seconds call
 *      comm_fail_timeout(); when ranks disagree about a collective call
 *      comm_fail_mismatch(); a rank that sees comm_job_stopping() must stop.
 *   5. Request completion: set req->t_done when the operation finished. */
#ifndef COMM_INTERNAL_H
#define COMM_INTERNAL_H
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "comm.h"
#include "device.h"

/* The threads backend pipelines in slices of this many elements (1 MiB of fp32): the
 * ring all-reduce moves slabs of N slices, broadcast and reduce one slice per step.
 * Tests that check the ring's rounding order need to know. */
#define COMM_SLICE_ELEMENTS ((size_t)1 << 18)

/* Kinds that are collective but not counted in comm_stats. */
#define COMM_KIND_SPLIT COMM_NKINDS

/* One collective (or send/recv) as the front end hands it to a backend. Fields that do
 * not apply are normalised (op -1, root -1) so that two calls compare equal exactly
 * when they match. */
typedef struct {
    int kind;             /* comm_kind, or COMM_KIND_SPLIT */
    const void *send;     /* in-place kinds (allreduce, broadcast, reduce): == recv */
    void *recv;
    size_t count;
    int dt;               /* comm_dtype */
    int op;               /* comm_op, or -1 */
    int root;             /* broadcast and reduce: the root; send/recv: the peer; or -1 */
                          /* (send/recv: op is 0 for send, 1 for recv) */
    int tag;              /* send/recv */
    uint64_t seq;         /* number of this collective in its group, from 1 */
    /* all-to-all: op 0 for the even form (`count` per peer, block j at j x count), op 1
     * for the -v form (count 0, these [size] arrays; NULL for the even form) */
    const size_t *send_counts, *send_offsets, *recv_counts, *recv_offsets;
} comm_call;

int comm_call_matches(const comm_call *a, const comm_call *b);
/* All-to-all: the block of `peer` on the send side (recv_side 0) or the receive side
 * (1): returns its length and sets *offset (elements). */
size_t comm_alltoall_block(const comm_call *call, int recv_side, int peer, size_t *offset);
/* Elements the blocks of one side reach in its buffer (the largest offset + length),
 * and elements a rank moves to (or from) the others: its own block excluded. */
size_t comm_alltoall_extent(const comm_call *call, int recv_side, int size);
size_t comm_alltoall_moved(const comm_call *call, int recv_side, int size, int rank);
/* All-to-all -v, the line a receiver stops the job with when rank `source` sends it
 * `sent` elements and its own recv_counts[source] says `expected`. */
void comm_alltoallv_mismatch(char *text, size_t size, const char *group, int source,
                             size_t sent, int receiver, size_t expected);
/* Whether a peer's count, arriving[j] (what rank j will send here, learnt by an
 * all-to-all of counts), differs from this rank's recv_counts[j]; the first such line
 * goes into why. The MPI and NCCL backends check their -v calls with it. */
int comm_alltoallv_arrivals_differ(const comm *c, const comm_call *call,
                                   const uint64_t *arriving, char *why, size_t size);
/* "allreduce(1000 x f32, sum)", "broadcast(10 x bf16, root 2)", "barrier". */
void comm_call_describe(const comm_call *call, char *out, size_t size);

typedef struct comm_job comm_job;
typedef struct comm_rank_state comm_rank_state;

struct comm_request {
    comm *c;
    comm_call call;
    double t_start;       /* comm_api.c, at start */
    double t_done;        /* the backend, when the operation completed */
    uint64_t flight;      /* flight recorder entry */
    int done;             /* backend-owned completion flag */
    comm_request *next;   /* backend queue link */
    comm_request *prev_unwaited, *next_unwaited;   /* comm_api.c: started, not yet waited */
    void *impl;           /* backend data */
    void *ready;          /* threads, CUDA ranks: the compute queued before the start */
};

typedef struct comm_backend {
    const char *name;
    int bytes_modelled;
    void (*run)(comm *c, const comm_call *call);      /* a blocking collective */
    void (*start)(comm *c, comm_request *req);        /* queue req->call, return at once */
    void (*wait)(comm *c, comm_request *req);         /* until done; sets req->t_done */
    void (*send)(comm *c, const comm_call *call);    /* call->root is the peer */
    void (*recv)(comm *c, const comm_call *call);
    /* Collective over c: returns this rank's new group made with comm_create(), or
     * NULL for a negative color. */
    comm *(*split)(comm *c, int color, int key, const char *name, uint64_t seq);
    void (*free)(comm *c);                            /* releases c->impl */
    /* Stops this rank (never returns) after making sure every rank will stop.
     * grace_seconds: how long to let other ranks print before ending them (MPI). */
    void (*stop)(comm *c, double grace_seconds);
    /* May be NULL. After this rank reported a timeout: name the ranks that did not (MPI,
     * where each process reports only itself). */
    void (*name_silent_ranks)(comm *c);
} comm_backend;

/* Accounting: one per comm (a rank's view of one group). Bytes may be added by the
 * peer that copied them, hence atomic. */
typedef struct {
    uint64_t calls[COMM_NKINDS];
    _Atomic uint64_t sent[COMM_NKINDS];
    _Atomic uint64_t received[COMM_NKINDS];
    double seconds[COMM_NKINDS];
    double async_seconds, hidden_seconds;
    /* the modelled link's time of what this rank took in, in whole nanoseconds: added by
     * the rank's thread or its comm worker, read by the rank */
    _Atomic uint64_t link_nanoseconds[COMM_NTIERS];
    _Atomic uint64_t tier_sent[COMM_NTIERS], tier_received[COMM_NTIERS];
} comm_counters;

struct comm {
    const comm_backend *backend;
    comm_job *job;
    comm_rank_state *rs;  /* the rank this handle belongs to */
    int rank, size;
    int *world_ranks;     /* [size]: group rank -> world rank */
    char name[32];
    uint64_t seq;         /* collectives issued on this group (comm_api.c) */
    comm_counters counters;
    comm *next_of_rank;   /* every comm of a rank, for comm_stats_all */
    comm_request *unwaited;   /* requests a rank stopped by a failure never waited */
    void *impl;           /* backend state */
};

/* ---- per-rank state: flight recorder, trace, memory -------------------------------- */
#define COMM_FLIGHT_LEN 8
enum { FLIGHT_QUEUED, FLIGHT_RUNNING, FLIGHT_DONE };

typedef struct {
    uint64_t id;          /* 1, 2, ...: position in the rank's history; 0 = unused */
    char group[32];
    comm_call call;
    int state;
    double t_start, t_end;
} comm_flight_entry;

typedef struct {
    char name[48];
    char group[32];
    int tid;
    double t0, t1;
    uint64_t bytes;
} comm_trace_event;

struct comm_rank_state {
    int world_rank;
    mem_stats mem;
    pthread_mutex_t lock;               /* flight + events: rank thread and its workers */
    comm_flight_entry flight[COMM_FLIGHT_LEN];
    uint64_t flight_count;
    comm_trace_event *events;
    size_t nevents, cap_events;
    struct { char name[48]; double t0; } open_spans[32];   /* rank thread only */
    int depth;
    comm *groups;                       /* list via next_of_rank; rank thread only */
    _Atomic int stats_paused;           /* comm_stats_pause: this rank counts nothing */
    _Atomic int finished;               /* rank_main has returned */
    _Atomic int status;                 /* ... with this value */
    void *impl;
};

struct comm_job {
    comm_options opts;
    int nranks;                 /* ranks of this process: threads N, MPI 1 */
    comm_rank_state *ranks;     /* [nranks] */
    double t0;                  /* trace time origin */
    _Atomic int failed;         /* set once, by the failure that prints the report */
    _Atomic int reported;       /* ... and that report is out */
    _Atomic int stop;           /* every rank must stop */
    _Atomic int exit_status;    /* the first failure's (comm.h's COMM_EXIT_*); 0: none yet */
    void *impl;
};

comm_job *comm_job_create(const comm_options *opts, int nranks, int first_world_rank);
void comm_job_free(comm_job *job);   /* frees every comm left in the ranks' lists */
static inline int comm_job_stopping(comm_job *job) { return atomic_load(&job->stop); }
comm *comm_create(comm_job *job, comm_rank_state *rs, const comm_backend *backend,
                  int rank, int size, const int *world_ranks, const char *name);

/* ---- what backends call ------------------------------------------------------------ */
/* Bytes that really moved: copier received them, owner (may be NULL) sent them, across
 * `tier`. */
void comm_count(comm *copier, comm *owner, int kind, comm_tier tier, uint64_t bytes);
/* Whether c's rank has its counting paused (comm_stats_pause). */
int comm_counting_paused(const comm *c);
/* The tier between this rank and group rank `peer` of c. */
comm_tier comm_tier_to(const comm *c, int peer);
/* Modelled link: how long `bytes` take on a tier of the job's links (0 for LINK_NONE). */
double comm_link_seconds(const comm_job *job, comm_tier tier, size_t bytes);

/* Records a call in the rank's flight recorder; returns its id for comm_flight_set. */
uint64_t comm_flight_begin(comm *c, const comm_call *call, int state);
void comm_flight_set(comm *c, uint64_t id, int state);
/* Counts a transfer's time on the modelled link of a tier into c's link_seconds. */
void comm_count_link(comm *c, comm_tier tier, double seconds);
/* Counts a call's textbook volume on backends whose bytes are modelled (else nothing). */
void comm_count_modelled(comm *c, const comm_call *call);

/* Failures. Each prints one report (only the first failure of a job prints) and
 * stops through backend->stop; none returns. `peer` names the rank waited for (group
 * rank), or -1. */
_Noreturn void comm_fail_timeout(comm *c, const comm_call *call, int peer,
                                 double waited);
/* A transfer the link model would hold longer than the timeout: reported as what it
 * is (a slow modelled wire), once, instead of a run that looks hung. */
_Noreturn void comm_fail_slow_link(comm *c, const comm_call *call, size_t bytes,
                                   double seconds);
_Noreturn void comm_fail_mismatch(comm *c, int other, const comm_call *mine,
                                  const comm_call *theirs);
_Noreturn void comm_fail(comm *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Claims the right to print the job's failure report: 1 for the first caller. */
int comm_claim_failure(comm_job *job);
/* The status the job exits with after a failure: the first one noted (comm.h's
 * COMM_EXIT_*), else COMM_EXIT_FAILED. */
void comm_note_exit_status(comm_job *job, int status);
int comm_job_exit_status(comm_job *job);

/* ---- reductions: dst = a op b elementwise; dst may be a or b, nothing else overlaps */
void comm_reduce_buffers(void *dst, const void *a, const void *b, size_t count,
                         comm_dtype dt, comm_op op);
void comm_divide_buffer(void *buf, size_t count, comm_dtype dt, int divisor);

/* ---- trace ------------------------------------------------------------------------ */
void comm_trace_span(comm *c, int tid, const char *name, double t0, double t1,
                     uint64_t bytes);
/* This rank's events as JSON objects, each followed by ",\n" (malloc'd). */
char *comm_trace_rank_json(const comm_job *job, const comm_rank_state *rs);
/* Writes {"traceEvents":[ parts... ]}; returns 0 or prints why not and returns -1. */
int comm_trace_write(const char *path, char **parts, int nparts);

/* ---- backends --------------------------------------------------------------------- */
/* Threads: the job's shared state and each rank's world comm. */
void threads_job_init(comm_job *job);
void threads_job_free(comm_job *job);
comm *threads_world(comm_job *job, int rank);
/* Runs fn on the calling rank thread; returns its status, or -1 when the rank was
 * stopped because of a failure. */
int threads_run_rank(comm *world, rank_main_fn fn, void *args);

#ifdef USE_MPI
int mpi_launch(const comm_options *opts, rank_main_fn fn, void *args);
#endif

/* ---- GPU buffers and NCCL: the GPU backend's hooks -----------------------------------
 * gpu/ fills one comm_gpu_hooks (device_gpu_backend()->comm); the functions below call
 * through it, so the backends here name no gpu/ header. Only CUDA ranks reach them.
 *
 * GPU buffers in the host-side backends: the threads backend (ranks sharing GPUs) and
 * the MPI backend (processes sharing GPUs) move bytes with host code; on ranks that
 * compute on CUDA they call these instead of memcpy and comm_reduce_buffers. A comm_gpu
 * is one (rank, group)'s GPU, stream and staging buffer. Pointers may be host or device
 * memory, mixed; all-host work runs on the host as on the CPU path. Every call has
 * finished its work when it returns, so that a peer may read the result as soon as the
 * step is published. copy has memmove semantics (an in-place all-gather may overlap).
 *
 * compute_done / compute_mark / wait_mark: the compute the calling rank has queued on
 * its stream produced the buffers a call is given: a blocking call waits for it; an
 * async start marks it (on the rank's thread) and the thread that runs the call waits
 * for the mark (which it releases). No-ops on a thread that computes on the CPU.
 *
 * The NCCL backend's launcher hooks:
 *   nccl_unique_id  once per job: by the launching thread, or MPI rank 0 + MPI_Bcast
 *   nccl_world      on each rank's own thread after device_select(DEVICE_CUDA, gpu);
 *                   every rank of the world must call it at the same time
 *   nccl_run_rank   runs rank_main so that a failure can stop the rank (threads) */
#define NCCL_ID_BYTES 128
typedef struct comm_gpu comm_gpu;
typedef struct comm_gpu_hooks {
    comm_gpu *(*open)(void);          /* on a thread that has selected its GPU */
    void (*close)(comm_gpu *g);       /* any thread */
    int (*is_device)(const void *ptr);   /* memory a host loop must not touch */
    void (*copy)(comm_gpu *g, void *dst, const void *src, size_t bytes);
    void (*reduce)(comm_gpu *g, void *dst, const void *a, const void *b, size_t count,
                   comm_dtype dt, comm_op op);
    void (*divide)(comm_gpu *g, void *buf, size_t count, comm_dtype dt, int divisor);
    void (*compute_done)(void);
    void *(*compute_mark)(void);
    void (*wait_mark)(void *mark);
    void (*nccl_unique_id)(unsigned char id[NCCL_ID_BYTES]);
    comm *(*nccl_world)(comm_job *job, comm_rank_state *rs, int world_rank, int world_size,
                        const unsigned char id[NCCL_ID_BYTES]);
    int (*nccl_run_rank)(comm *world, rank_main_fn fn, void *args);
} comm_gpu_hooks;

static inline const comm_gpu_hooks *comm_gpu_hooks_get(void) {
    const device_backend *gpu = device_gpu_backend();
    if (!gpu) {
        fprintf(stderr, "comm: a GPU buffer operation in a build without GPU support\n");
        abort();
    }
    return gpu->comm;
}
static inline comm_gpu *comm_gpu_open(void) { return comm_gpu_hooks_get()->open(); }
static inline void comm_gpu_close(comm_gpu *g) {
    if (g) comm_gpu_hooks_get()->close(g);
}
static inline int comm_gpu_is_device(const void *ptr) {
    return comm_gpu_hooks_get()->is_device(ptr);
}
static inline void comm_gpu_copy(comm_gpu *g, void *dst, const void *src, size_t bytes) {
    comm_gpu_hooks_get()->copy(g, dst, src, bytes);
}
static inline void comm_gpu_reduce(comm_gpu *g, void *dst, const void *a, const void *b,
                                   size_t count, comm_dtype dt, comm_op op) {
    comm_gpu_hooks_get()->reduce(g, dst, a, b, count, dt, op);
}
static inline void comm_gpu_divide(comm_gpu *g, void *buf, size_t count, comm_dtype dt,
                                   int divisor) {
    comm_gpu_hooks_get()->divide(g, buf, count, dt, divisor);
}
static inline void comm_gpu_compute_done(void) { comm_gpu_hooks_get()->compute_done(); }
static inline void *comm_gpu_compute_mark(void) { return comm_gpu_hooks_get()->compute_mark(); }
static inline void comm_gpu_wait_mark(void *mark) {
    if (mark) comm_gpu_hooks_get()->wait_mark(mark);
}
static inline void nccl_unique_id(unsigned char id[NCCL_ID_BYTES]) {
    comm_gpu_hooks_get()->nccl_unique_id(id);
}
static inline comm *nccl_world(comm_job *job, comm_rank_state *rs, int world_rank,
                               int world_size, const unsigned char id[NCCL_ID_BYTES]) {
    return comm_gpu_hooks_get()->nccl_world(job, rs, world_rank, world_size, id);
}
static inline int nccl_run_rank(comm *world, rank_main_fn fn, void *args) {
    return comm_gpu_hooks_get()->nccl_run_rank(world, fn, args);
}

/* ---- rank threads of in-process backends (threads, NCCL) --------------------------- */
/* Where a thread goes when the job stops: back to the setjmp of the function that
 * started its work (comm_run_rank_thread for rank threads). */
extern _Thread_local jmp_buf *comm_thread_escape;
_Noreturn void comm_leave_thread(void);
/* Runs fn as one rank: a stop on this thread returns -1 here, and a non-zero return
 * of fn stops the whole job with a message naming the rank. */
int comm_run_rank_thread(comm *world, rank_main_fn fn, void *args);

#endif
