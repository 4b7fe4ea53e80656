/* Pipeline schedules as per-rank lists of operations.
 *
 * A schedule for p stages (ranks), m micro-batches and v chunks per rank is, for each
 * rank, the exact sequence of what it does: compute passes and the point-to-point
 * messages between them. The executor (real ranks) and the simulator (pp_sim.h) run
 * the same lists, so what the simulator shows is what the ranks do.
 *
 * Virtual stages: the model is cut into S = p x v consecutive pieces; chunk c of rank
 * r is virtual stage c*p + r (Narayanan et al. 2021). Without interleaving v = 1 and
 * the virtual stage is the rank. Activations go from virtual stage s to s + 1,
 * gradients from s + 1 back to s; nothing is sent before stage 0 or after stage S - 1.
 *
 * The schedules:
 *   naive        m = 1: the whole batch forward through every stage, then backward.
 *   gpipe        all m forwards, then all m backwards (last micro-batch first).
 *   1f1b         PipeDream-flush as in Megatron-LM: rank r runs min(p-r-1, m) warm-up
 *                forwards, then one forward and one backward in turn, then drains;
 *                at most p - r micro-batches in flight on rank r.
 *   interleaved  Megatron-LM's interleaved 1F1B: micro-batches taken in groups of p
 *                through chunk 0, then chunk 1, ...; warm-up 2(p-r-1) + (v-1)p chunk
 *                forwards (all of them when m = p). Needs v >= 2 and m a multiple of p
 *                (the classic form).
 *   zb-h1        Qi et al. 2023: the backward split into B (input gradient, which the
 *                previous stage waits for) and W (weight gradient, which nobody waits
 *                for). F and B keep 1F1B's order; a W runs where the rank would
 *                otherwise wait, or when p micro-batches are in flight (1F1B's peak,
 *                rank 0's), so the drain fills with W passes.
 *   zb-v         Qi et al. 2024 (ZB-V): two chunks per rank placed in a V, chunk 0 of
 *                rank r is stage r and chunk 1 stage 2p-1-r, so rank 0 holds the first
 *                and the last stage and a micro-batch turns round on rank p-1 (whose two
 *                chunks pass it on in memory, not as a message). Backward split into B
 *                and W as zb-h1. Warm-up: 2p-1-2r chunk-0 forwards, then r times a
 *                chunk-1 and a chunk-0 forward; then groups of one forward, one B and
 *                one W of a chunk: p-r groups of chunk 1, then chunk 0 and chunk 1 in
 *                turn until the forwards are done; the remaining B in the same turn,
 *                W filling the waits. At most 2p chunk passes held (1F1B's p stages).
 *   dualpipev    DualPipeV (DeepSeek-V3's DualPipe cut in half, Sea AI Lab): the same V,
 *                m >= 2p, as DeepSeek's DualPipeV asserts (num_chunks >= 2 x ranks: rank
 *                0 alone runs 2p - 1 forwards before its first backward). Rank r: 2(p-r-1) chunk-0 forwards; r+1 pairs F0 F1; p-r-1
 *                times B1 (split), its W, F1; then m-2p+r+1 times F0&B1 and F1&B0, each
 *                a forward of one chunk and a whole backward of the other run as one
 *                (F&B: on GPUs one's communication hides under the other's compute;
 *                CPU ranks run them one after the other; on rank p-1 the first F0 and
 *                B1 apart); p-r-1 times B1 and F1&B0; r+1 times B1 and B0, the latter
 *                half split; p-r-1 times a W and a split B0; the r+1 W left. Every W
 *                where the plan puts it. At most 2p+1 chunk passes held (PP + 1).
 *
 * Communication order. On GPUs a send blocks until the receiver has posted the matching
 * receive (NCCL), so the order of sends and receives on each rank decides whether the
 * pipeline deadlocks. Placing every send right after the pass that produced it and
 * every receive right before the pass that needs it (PP_COMM_EAGER) deadlocks 1F1B:
 * rank 0 sends activation 1 while rank 1 sends gradient 0, and each waits for the
 * other's receive. PP_COMM_ORDERED (the default) gives every message one time on a
 * global clock, taken from a dry run of the schedule (unit pass times, free messages):
 * the first moment after the pass that makes it at which both of its ranks are between
 * passes, or failing that the moment the receiver needs it. Every rank does its passes
 * and messages in the order of that clock (ties by message). Then the earliest
 * unfinished operation of all ranks can always complete: a message's two ranks have
 * both done everything before it. So the lists cannot deadlock, whatever the real
 * pass times; with NCCL-like streams (pp_sim.h) they also keep the dry run's timing. */
#ifndef PP_SCHEDULE_H
#define PP_SCHEDULE_H
#include <stddef.h>

typedef enum {
    PP_NAIVE, PP_GPIPE, PP_1F1B, PP_INTERLEAVED, PP_ZB_H1, PP_ZB_V, PP_DUALPIPE_V,
    PP_NSCHEDULES
} pp_schedule_kind;

/* What a schedule is called and what it takes: the one table every program, flag and
 * report reads (pp_schedule.c). */
typedef struct {
    const char *name;       /* --schedule NAME: "naive", "gpipe", "1f1b", ... */
    const char *strategy;   /* its run in tables and --json: "pp-naive", "pp-1f1b", ... */
    const char *summary;    /* what it is, in a few words */
    int takes_virtual;      /* 1: --virtual chunks per rank (v >= 2); else v = 1 */
    int whole_batch;        /* 1: one micro-batch, the whole batch (m = 1) */
    int vshape;             /* 1: two chunks per rank in a V (chunk 1 = stage 2p-1-r) */
    int split_backward;     /* 1: B (d input) and W (d weights) run apart */
} pp_schedule_info;

/* The row of kind; NULL for a kind out of range. */
const pp_schedule_info *pp_schedule_about(pp_schedule_kind kind);
/* "naive", "gpipe", "1f1b", "interleaved", "zb-h1" ("?" out of range); and back
 * (-1: unknown). */
const char *pp_schedule_name(pp_schedule_kind kind);
int pp_schedule_from_name(const char *name);
/* A flag's choices: every schedule's name in kind order, then `extra` when not NULL
 * (chapter 4's "all"), then NULL. */
void pp_schedule_choices(const char *choices[PP_NSCHEDULES + 2], const char *extra);
/* The micro-batches and chunks per rank kind runs with, given those asked for: m = 1
 * for a whole-batch schedule, v = 2 for a V, v = 1 for one that takes no --virtual. */
int pp_schedule_micro(pp_schedule_kind kind, int micro);
int pp_schedule_chunks(pp_schedule_kind kind, int chunks);

typedef enum {
    PP_FORWARD,
    PP_BACKWARD,          /* B and W together */
    PP_BACKWARD_INPUT,    /* B: d(input), what the previous stage waits for */
    PP_BACKWARD_WEIGHT,   /* W: d(weights) */
    PP_SEND_ACT,          /* output activations to the next virtual stage */
    PP_RECV_ACT,          /* input activations from the previous one */
    PP_SEND_GRAD,         /* d(input) to the previous virtual stage */
    PP_RECV_GRAD,         /* d(output) from the next one */
    PP_NKINDS
} pp_op_kind;

/* "F", "B", "Bi", "W", "send-act", "recv-act", "send-grad", "recv-grad". */
const char *pp_op_kind_name(pp_op_kind kind);
int pp_op_is_compute(pp_op_kind kind);

/* One operation of a rank. For a send or receive, micro and chunk name the pass whose
 * activation or gradient travels, on the side of this rank (a send of the activation of
 * chunk c arrives at the receiver's chunk of virtual stage + 1). */
typedef struct {
    pp_op_kind kind;
    int micro;            /* 0..m-1 */
    int chunk;            /* local chunk 0..v-1 */
    int peer;             /* the other rank of a send or receive; -1 for compute */
    int fused;            /* F of DualPipe's F&B: overlapped with the next compute op,
                             a backward of the other chunk (GPU streams; pp_sim.h) */
} pp_op;

typedef struct {
    pp_op *ops;
    int count;
} pp_rank_ops;

typedef enum { PP_COMM_ORDERED, PP_COMM_EAGER } pp_comm_order;

typedef struct {
    pp_schedule_kind kind;
    int stages, micro, chunks;   /* p, m, v (v = 1 unless interleaved) */
    pp_comm_order order;
    pp_rank_ops *ranks;          /* [stages] */
    int bidirectional;           /* DualPipe (pp_dualpipe_make): kind is PP_DUALPIPE_V */
} pp_schedule;

/* One clear message in err (and 0) for a combination that cannot run; 1 when it can.
 * Checks p, m, v >= 1; p <= layers; v x p <= layers; m dividing the batch; naive with
 * m = 1; v > 1 only for interleaved and the V (exactly 2, with 2p <= layers);
 * dualpipev's m >= 2p; interleaved's p >= 2, v >= 2 and m a multiple of p. */
int pp_validate(pp_schedule_kind kind, int stages, int micro, int chunks, int layers,
                int batch, char *err, size_t err_size);

/* The op lists (allocated with the accounting allocator, MEM_OTHER), or NULL with a
 * message on stderr when pp_validate refuses (p, m, v) for any model. */
pp_schedule *pp_schedule_make(pp_schedule_kind kind, int stages, int micro, int chunks,
                              pp_comm_order order);
void pp_schedule_free(pp_schedule *s);

/* DualPipe itself (DeepSeek-V3), for the simulator: p ranks, the model cut into p stages
 * and held twice, copy 0's stage r and copy 1's stage p-1-r on rank r (chunks 0 and 1,
 * placed as the V's: virtual stages r and 2p-1-r), micro-batches fed from both ends:
 * the first m/2 run through copy 0 (rank 0 to p-1), the rest through copy 1 (rank p-1
 * to 0). Rank r runs DualPipeV's plan for half rank min(r, p-1-r) of p/2 with m/2
 * micro-batches a direction, its chunks swapped on the second half of the ranks (their
 * first direction is copy 1's); the middle two ranks pass a micro-batch on by message
 * where DualPipeV's last rank turns it in memory. As DeepSeek's DualPipe asserts: p and
 * m even, m >= 2p. A pass is a whole stage of p (a V's chunk is half of one). The
 * executor does not run it (its two copies' gradients would need summing). */
int pp_dualpipe_validate(int stages, int micro, int layers, int batch, char *err,
                         size_t err_size);
pp_schedule *pp_dualpipe_make(int stages, int micro, pp_comm_order order);

/* The virtual stages micro-batch micro runs through, first .. last: all S = p x chunks
 * of them, but for DualPipe, whose micro-batches run through one copy's p. */
void pp_micro_stages(int bidirectional, int stages, int chunks, int micro_count, int micro,
                     int *first, int *last);

/* Where the model's pieces sit: chunk c of rank r is virtual stage c*p + r (v chunks
 * interleaved), or in a V stage r (chunk 0) and 2p-1-r (chunk 1). And back: the rank
 * and chunk of stage k of p x v. */
int pp_stage_of(int vshape, int stages, int rank, int chunk);
void pp_place_of(int vshape, int stages, int stage, int *rank, int *chunk);
int pp_virtual_stage(const pp_schedule *s, int rank, int chunk);
int pp_schedule_vshape(pp_schedule_kind kind);

/* The largest number of (micro-batch, chunk) passes rank holds activations for at
 * once: from its forward until its backward (split: until its W) has run. */
int pp_peak_in_flight(const pp_schedule *s, int rank);

/* The textbook bubble for unit forward time and backward twice that (zb-h1: B and W
 * one each): fraction = idle / (idle + busy) per rank, over_ideal = idle / busy.
 *   naive, gpipe, 1f1b: (p-1)/(m+p-1)      interleaved: (p-1)/(v m + p-1)
 *   zb-h1: idle (p-1)(T_F + T_B - T_W) = (p-1) against busy 3m: (p-1)/(3m + p-1)
 *   zb-v: zero bubble at T_F = T_B = T_W (Qi et al.) but for the fill of the V, which
 *         their picture hides under the next step: p-1 chunk forwards, (p-1) T_F / 2,
 *         against busy 3m: (p-1)/(6m + p-1), for m >= p (fewer cannot fill the V)
 *   dualpipev: DeepSeek's (PP/2 - 1)(F&B + B - 3W) with PP = 2p stages and a chunk's
 *         F = 1/2, B = 1 (whole), W = 1/2, F&B = F + B (not overlapped): p-1 against
 *         busy 3m, (p-1)/(3m + p-1), zb-h1's; overlapped F&B: pp_sim.h's fb_overlap */
typedef struct {
    double fraction, over_ideal;
} pp_bubble;
pp_bubble pp_bubble_formula(pp_schedule_kind kind, int stages, int micro, int chunks);

/* An operation as it ran (simulated or measured); times in any one unit. Drawings show
 * the compute passes and leave the sends and receives out. */
typedef struct {
    int rank;
    pp_op_kind kind;
    int micro, chunk;
    double start, end;
} pp_span;

#endif
