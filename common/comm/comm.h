/* The communicator: one API for every strategy, whatever carries the bytes.
 *
 * Backends: threads (ranks are threads of one process, ring collectives written here
 * over shared memory), Open MPI (ranks are processes), NCCL (gpu/). A chapter is
 * written once as a rank_main(comm *world, void *args) and started by launch().
 *
 * Every call is collective over the group unless it says otherwise, and all ranks of a
 * group must issue the same collectives in the same order with the same counts, dtype,
 * op and root. A mismatch is detected and reported naming both ranks; a wait that
 * exceeds the timeout reports where every rank is stuck; a failing rank stops all.
 * (Threads: each rank checks its left neighbour's call before touching its bytes, and
 * one report shows every rank's state and last operations. MPI: an all-gather of every
 * rank's call precedes each collective; blocking MPI calls run under a watchdog and
 * every process reports its own state. A rank that skips a collective shows up as a
 * timeout, or as a mismatch if it calls a different one next.)
 *
 * Uneven sharding: reduce-scatter and all-gather split `count` elements into
 * comm_shard() pieces, rank r owning [offset_r, offset_r + len_r); the first
 * count % size ranks hold one element more. */
#ifndef COMM_H
#define COMM_H
#include <stddef.h>
#include <stdint.h>

#include "alloc.h"
#include "device.h"
#include "precision.h"

typedef struct comm comm;
typedef struct comm_request comm_request;

typedef enum { COMM_SUM, COMM_AVG, COMM_MAX } comm_op;

/* Element types on the wire. Reductions of the 16- and 8-bit types are carried out
 * in fp32 and rounded back (as NCCL does), so compressed gradients really send 2 or
 * 1 bytes per element. f64 is reduced in double: for sums and counters that fp32
 * would round (losses, norms, step times). COMM_NDTYPES counts the types. */
typedef enum { COMM_F32, COMM_BF16, COMM_F16, COMM_F8E4M3, COMM_F64, COMM_NDTYPES } comm_dtype;
size_t comm_dtype_size(comm_dtype dt);
/* The wire type of a run precision's elements: f32, bf16, f16. */
comm_dtype comm_dtype_of(precision p);
const char *comm_dtype_name(comm_dtype dt);     /* "f32", "bf16", "f16", "f8e4m3", "f64" */

/* Conversions used on the wire (also handy for compressing gradients by hand). All
 * round to nearest, ties to even; fp16 overflows to infinity; e4m3 (OCP "FN": no
 * infinity, max 448) saturates to +-448; NaN stays NaN. comm_convert converts count
 * elements; dst and src must not overlap unless they have the same type. */
uint16_t comm_f32_to_bf16(float x);
float comm_bf16_to_f32(uint16_t h);
uint16_t comm_f32_to_f16(float x);
float comm_f16_to_f32(uint16_t h);
uint8_t comm_f32_to_f8e4m3(float x);
float comm_f8e4m3_to_f32(uint8_t b);
void comm_convert(void *dst, comm_dtype dst_dt, const void *src, comm_dtype src_dt,
                  size_t count);

/* Threads backend: the ring (bandwidth-optimal, 2(N-1) steps), naive (gather to rank 0,
 * copy back) and recursive doubling (latency-optimal: ceil(log2 N) steps, the whole
 * buffer each; see comm_threads.c). */
typedef enum { ALLREDUCE_RING, ALLREDUCE_NAIVE, ALLREDUCE_DOUBLING } comm_allreduce_algo;

/* ---- identity and groups ------------------------------------------------------------ */
int comm_rank(const comm *c);
int comm_size(const comm *c);
int comm_world_rank(const comm *c);       /* this rank's number in the world group */
const char *comm_backend_name(const comm *c);   /* "threads", "mpi", "nccl" */
/* Ranks with equal color form a group, ordered by key (ties by rank). Collective.
 * A rank passing a negative color joins no group and gets NULL. */
comm *comm_split(comm *c, int color, int key, const char *name);
const char *comm_name(const comm *c);     /* "world", or the name given to split */
void comm_free(comm *c);

/* The piece of `count` elements that `rank` owns; returns its length. */
size_t comm_shard(size_t count, int size, int rank, size_t *offset);

/* ---- blocking collectives (buffers hold `count` elements of `dt`) ------------------ */
void comm_allreduce(comm *c, void *buf, size_t count, comm_dtype dt, comm_op op);
/* send holds count elements; recv receives this rank's shard (comm_shard length).
 * recv may point into send at this rank's offset (in place). */
void comm_reduce_scatter(comm *c, const void *send, void *recv, size_t count,
                         comm_dtype dt, comm_op op);
/* send holds this rank's shard; recv receives all count elements. send may point
 * into recv at this rank's offset (in place). */
void comm_allgather(comm *c, const void *send, void *recv, size_t count, comm_dtype dt);
void comm_broadcast(comm *c, void *buf, size_t count, comm_dtype dt, int root);
/* In place: on return the root's buf holds the reduction, the others' are unchanged. */
void comm_reduce(comm *c, void *buf, size_t count, comm_dtype dt, comm_op op, int root);
void comm_barrier(comm *c);

/* All-to-all: send holds `size` blocks of `count` elements; block j goes to rank j,
 * into block r (this rank's number) of j's recv. The block to itself is a local copy.
 * send and recv must not overlap. Bytes sent per rank: (N-1) count x element size. */
void comm_alltoall(comm *c, const void *send, void *recv, size_t count, comm_dtype dt);
/* The uneven form (expert parallelism, Ulysses with uneven heads): send_counts[j]
 * elements at send + send_offsets[j] go to rank j, which receives them at its recv +
 * recv_offsets[r]; blocks may be empty. Every rank passes arrays of `size` entries,
 * and recv_counts[j] must equal rank j's send_counts[r]: a rank that does not know
 * what it will receive learns it first with comm_alltoall of one count per peer.
 * Counts that disagree stop the job naming both ranks. Bytes sent per rank: the sum
 * of send_counts[j] over j != rank, x element size (the block to itself stays). */
void comm_alltoallv(comm *c, const void *send, const size_t *send_counts,
                    const size_t *send_offsets, void *recv, const size_t *recv_counts,
                    const size_t *recv_offsets, comm_dtype dt);

/* ---- point to point (not collective; messages of one tag arrive in order) -------- */
/* Buffered (the default, comm_options.send_mode): comm_send returns once buf has been
 * copied, without waiting for the receiver, so two ranks may send to each other before
 * receiving. Rendezvous (threads backend): comm_send returns when the receiver has
 * taken the message, as NCCL's send does, so an order of sends and receives that
 * would deadlock on GPUs stops here too, with the timeout's report. The receiver's
 * count and dtype must match the sender's. Tags are 0..32767. */
void comm_send(comm *c, const void *buf, size_t count, comm_dtype dt, int peer, int tag);
void comm_recv(comm *c, void *buf, size_t count, comm_dtype dt, int peer, int tag);

/* Not collective: lets messages this rank has already sent move while it is busy
 * elsewhere (sleeping in a modelled pass, computing). Open MPI moves a message larger
 * than its eager limit only while the sender is inside an MPI call, so a sender that
 * sleeps holds its receiver up; this is such a call (MPI: comm_mpi_progress.c). Threads
 * and NCCL move messages without the sender: nothing to do. Cheap; call it every
 * millisecond or so while away from comm. */
void comm_progress(comm *c);

/* ---- asynchronous collectives: start now, wait later ------------------------------ */
/* Buffers must stay untouched until comm_wait returns. Requests complete in the order
 * they were started within a group. Threads and NCCL also run them in that order, so a
 * request may read what an earlier one writes; MPI does not promise this: wait first.
 * A blocking call issued while requests are pending runs after them. Threads backend: a communication thread per rank and group executes
 * the queue, so compute overlaps communication. MPI: the MPI_I* calls; the mismatch
 * check at start is a small blocking exchange. */
comm_request *comm_allreduce_start(comm *c, void *buf, size_t count, comm_dtype dt,
                                   comm_op op);
comm_request *comm_reduce_scatter_start(comm *c, const void *send, void *recv,
                                        size_t count, comm_dtype dt, comm_op op);
comm_request *comm_allgather_start(comm *c, const void *send, void *recv, size_t count,
                                   comm_dtype dt);
void comm_wait(comm_request *req);    /* frees the request */

/* ---- failure ------------------------------------------------------------------------ */
/* How a failed job exits, so that ./run --max-restarts restarts only what a fresh start
 * may cure (docs/restarts.md): COMM_EXIT_FAILED, the job's own failure that would come
 * again (a diverged loss, a collective mismatch, a failed comparison); COMM_EXIT_RANK_LOST
 * (75, sysexits.h's EX_TEMPFAIL), a rank stuck past --comm-timeout or lost. Bad input
 * is 2, and a process killed by signal N ends 128 + N. */
enum { COMM_EXIT_FAILED = 1, COMM_EXIT_RANK_LOST = 75 };

/* Stops every rank: prints "rank R failed: <message>" and exits COMM_EXIT_FAILED
 * (threads: the other ranks stop at their next comm call and launch returns it). */
_Noreturn void comm_abort(comm *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The same for a rank that is lost (a device or link gone), not wrong: COMM_EXIT_RANK_LOST. */
_Noreturn void comm_abort_lost(comm *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- accounting ----------------------------------------------------------------- */
typedef enum {
    COMM_KIND_ALLREDUCE,
    COMM_KIND_REDUCE_SCATTER,
    COMM_KIND_ALLGATHER,
    COMM_KIND_BROADCAST,
    COMM_KIND_REDUCE,
    COMM_KIND_SENDRECV,
    COMM_KIND_BARRIER,
    COMM_KIND_ALLTOALL,        /* both forms */
    COMM_NKINDS
} comm_kind;
const char *comm_kind_name(comm_kind kind);

typedef struct {
    uint64_t calls[COMM_NKINDS];
    uint64_t bytes_sent[COMM_NKINDS];
    uint64_t bytes_received[COMM_NKINDS];
    double seconds[COMM_NKINDS];   /* time a rank's program was blocked on comm */
    double async_seconds;          /* time async operations were in flight */
    double hidden_seconds;         /* ... of which overlapped with compute */
    /* threads backend with --link: the modelled link's time (latency + bytes /
     * bandwidth, scaled) of every transfer this rank took in, which it waited out at
     * least: the wire's share by the model, whatever else the machine runs (to the
     * nanosecond a transfer). 0 with no link and on the other backends. */
    double link_seconds;
    /* ... and per tier (comm_tier below), with the bytes this rank took in (received)
     * and gave out (sent) across each: every backend, measured copies on threads,
     * textbook volume between ring neighbours (or to each peer) on the others */
    double tier_link_seconds[2];
    uint64_t tier_sent[2], tier_received[2];
} comm_stats;

/* This rank's totals: for one group, or (comm_stats_all) over every group of the rank. */
comm_stats comm_stats_get(const comm *c);
comm_stats comm_stats_all(const comm *c);
void comm_stats_reset(comm *c);          /* resets the rank's stats in all its groups */
/* While paused, nothing this rank sends, receives or waits for is counted in any of its
 * groups (the run's own checking traffic, such as step 1's gradients gathered for the
 * comparison). Every rank of a collective pauses alike. */
void comm_stats_pause(comm *c, int paused);
uint64_t comm_stats_total_sent(const comm_stats *s);
double comm_stats_total_seconds(const comm_stats *s);
/* True when bytes are counted from the algorithm's textbook volume (MPI, NCCL) rather
 * than measured from the copies this program made (threads: a copy out of a peer's
 * buffer counts as received by the copier and sent by the peer). Textbook volume per
 * rank for B bytes on N ranks: all-reduce 2(N-1)/N B, reduce-scatter and all-gather
 * (N-1)/N B, broadcast and reduce B along a chain (the end of the chain sends, resp.
 * the start receives, nothing), send/recv B, all-to-all the blocks to the other
 * ranks (sum of send_counts[j], j != rank, x element size; received: recv_counts). */
int comm_bytes_are_modelled(const comm *c);
/* The memory accounting of the rank that owns c (bound by launch on every rank). */
mem_stats *comm_mem_stats(comm *c);

/* ---- launcher ----------------------------------------------------------------------- */
typedef int (*rank_main_fn)(comm *world, void *args);

/* The modelled wire (threads backend): every chunk a rank copies from a peer takes at
 * least latency + bytes / bandwidth of wall time, both multiplied by link_scale; the
 * figures are comm_link_spec's (NVLink 900 GB/s and 2 us, IB 50 GB/s and 5 us,
 * Ethernet 3.125 GB/s and 30 us). */
typedef enum { LINK_NONE, LINK_NVLINK, LINK_IB, LINK_ETHERNET, COMM_NLINKS } comm_link;

/* A link's figures, written once (comm_job.c): the threads backend's model, the
 * planners and the chapters' tables all read them. LINK_NONE: bandwidth 0 (no model). */
typedef struct {
    const char *name;      /* the --link value: "nvlink" */
    const char *title;     /* for tables: "NVLink 900 GB/s" */
    double bandwidth;      /* bytes per second */
    double latency;        /* seconds per message */
} comm_link_figures;
comm_link_figures comm_link_spec(comm_link link);

/* Two tiers of links (threads backend): with ranks_per_node K > 0, world ranks
 * [nK, (n+1)K) sit on node n; a transfer between two ranks of one node crosses the
 * intra-node link (comm_options.link), one between nodes link_inter. K = 0: one tier,
 * every transfer on `link` and counted as intra-node. Every transfer is timed by the
 * tier it crosses (alpha + bytes / beta of that tier's comm_link_spec, x link_scale),
 * and its bytes are counted per tier (comm_stats.tier_*). comm_tiers.c. */
typedef enum { COMM_TIER_INTRA, COMM_TIER_INTER, COMM_NTIERS } comm_tier;
typedef struct comm_options comm_options;
const char *comm_tier_name(comm_tier tier);           /* "intra-node", "inter-node" */
comm_tier comm_tier_between(const comm_options *o, int world_a, int world_b);
comm_link comm_tier_link(const comm_options *o, comm_tier tier);
/* One transfer of `bytes` on a tier: link_scale x (latency + bytes / bandwidth); 0 on
 * LINK_NONE. The threads backend waits this out; the planners predict with it. */
double comm_tier_seconds(const comm_options *o, comm_tier tier, size_t bytes);

/* What comm_send waits for on the threads backend (see comm_send). MPI and NCCL keep
 * their own: MPI buffers, NCCL's send is a rendezvous. */
typedef enum { COMM_SEND_BUFFERED, COMM_SEND_RENDEZVOUS } comm_send_mode;

/* Bounds of the options. A week of timeout keeps every deadline a finite time_t; a
 * link 10^4 times slower than ethernet already takes 0.3 s per message. */
#define THREADS_MAX_RANKS 4096
#define COMM_TIMEOUT_MAX_SECONDS (7 * 24 * 3600.0)
#define LINK_SCALE_MAX 1e4

struct comm_options {
    int ranks;                       /* threads backend; MPI takes mpirun's -np */
    comm_allreduce_algo allreduce;   /* threads backend */
    comm_link link;                  /* threads backend: modelled wire (two tiers: the
                                        link inside a node) */
    double link_scale;               /* 1 = as the link is; 10 = ten times slower */
    double timeout_seconds;          /* every blocking wait (<= 0: the default) */
    const char *trace_path;          /* NULL: no trace */
    device_kind device;              /* where ranks compute (device.h): CPU by default,
                                        so that options built by hand keep the CPU path
                                        (the command line's default is auto). CUDA
                                        ranks: one GPU each through NCCL when there are
                                        GPUs enough, else sharing GPUs (threads) */
    int tf32;                        /* CUDA: let cuBLAS use TF32 tensor cores */
    comm_send_mode send_mode;        /* threads backend: buffered (0) or rendezvous */
    comm_link link_inter;            /* two tiers: the link between nodes (above) */
    int ranks_per_node;              /* two tiers: ranks of a node; 0: one tier */
};

/* Defaults: 1 rank, ring, no link model, scale 1, 60 s timeout, no trace, buffered
 * sends. */
comm_options comm_options_default(void);

/* Runs fn on every rank (threads or MPI processes, as built) and returns the exit
 * status: 0 when every rank returned 0. Binds each rank's memory accounting, sets one
 * OpenBLAS thread per rank, and writes the trace when asked.
 * An MPI build uses MPI when started by mpirun (launch_mpi_world_size() > 0) and
 * threads otherwise. After a failure (timeout, mismatch, comm_abort, a rank_main
 * returning non-zero) the threads backend stops every rank at its next comm call and
 * launch returns the failure's exit status (above; main should return it); MPI ends the
 * job with it (MPI_Abort). */
int launch(const comm_options *opts, rank_main_fn fn, void *args);
/* The two backends by name. launch_mpi initialises MPI (MPI_THREAD_MULTIPLE) on first
 * use and finalises it at exit, so it may be called several times; in a build without
 * MPI it prints an error and returns 2. Under MPI a rank that has returned waits for
 * the others without a deadline: one stuck in comm times out by itself. */
int launch_threads(const comm_options *opts, rank_main_fn fn, void *args);
int launch_mpi(const comm_options *opts, rank_main_fn fn, void *args);

/* Number of ranks this process will run when launched by ./run under MPI (the world
 * size from the environment), or 0 when not under mpirun. Lets main validate sizes
 * before any rank starts. */
int launch_mpi_world_size(void);
/* The other facts of mpirun's environment, read here alone: this process's world rank
 * (0 when not under mpirun) and how many processes mpirun started on this node (0 when
 * not under mpirun). */
int launch_mpi_world_rank(void);
int launch_mpi_local_size(void);
/* True in the process that runs world rank 0 (always, for the threads backend): the
 * baseline is trained there before launch(), and it prints the tables. */
int process_hosts_rank0(void);

/* ---- devices ------------------------------------------------------------------------ */
/* Makes the calling thread compute where opts says, as launch does for each rank:
 * rank `index` of this process gets GPU index % GPUs; applies opts->tf32. Returns the
 * device chosen (device_select_for_rank). For code that computes outside launch (a
 * baseline, a helper thread). */
device_kind launch_select_device(const comm_options *opts, int index);
/* The backend launch() will run `world` ranks on: "threads", "mpi" or "nccl" (what
 * comm_backend_name() will then say), known before any rank starts. */
const char *launch_backend_name(const comm_options *opts, int world);
/* One line on what launch will run for `world` ranks, for the header of a run, e.g.
 * "device: cuda (1 GPU: NVIDIA H200); communicator: threads over a shared GPU (4 ranks
 * on 1 GPU: device copies and reduction kernels)". */
void launch_describe(const comm_options *opts, int world, char *out, size_t size);

/* ---- trace -------------------------------------------------------------------------- */
/* Spans on this rank's track; the comm layer records its own. No-ops without --trace.
 * Chrome trace JSON: pid 0, tid = world rank; asynchronous collectives, which overlap
 * the rank's own spans, are drawn on a second track per rank, tid = 1000 + world rank.
 * Call from the rank's own thread; spans nest. */
void trace_begin(comm *c, const char *name);
void trace_end(comm *c);
double comm_now(void);   /* monotonic seconds */

#endif
