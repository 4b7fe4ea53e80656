/* Watching the ops of a thread: an observer and a profiler see each op begin and end,
 * and each matrix product a backend runs inside an op. */
#ifndef OPS_OBSERVE_H
#define OPS_OBSERVE_H

/* An observer sees every op the calling thread runs, just before and just after it:
 * chapter 1's DataParallel takes a global interpreter lock there, as Python takes its
 * GIL around each op; a profiler times each kind. Per thread, like the device. Matmuls
 * and attention are split into forward and backward kinds, so that a profile shows
 * each; residual adds are apart from the other vector ops (copies, zeroing). */
typedef enum {
    OP_EMBEDDING, OP_LAYERNORM, OP_LINEAR_FORWARD, OP_LINEAR_BACKWARD,
    OP_ATTENTION_FORWARD, OP_ATTENTION_BACKWARD, OP_GELU, OP_CROSSENTROPY, OP_ADAMW,
    OP_RESIDUAL, OP_VECTOR, OP_TRANSFER, OP_KINDS
} op_kind;
typedef struct {
    void (*begin)(void *ctx, op_kind kind);
    void (*end)(void *ctx, op_kind kind);
    void *ctx;
    /* Optional (NULL: not told). traffic: the bytes the op must at least read and
     * write, told between begin and end. gemm_begin/gemm_end: around each matrix
     * product a backend runs inside the op (op(A)[M,K] @ op(B)[K,N]), so that a
     * profiler sees the real shapes, causal blocks included. */
    void (*traffic)(void *ctx, op_kind kind, double bytes);
    void (*gemm_begin)(void *ctx, int trans_a, int trans_b, int M, int N, int K);
    void (*gemm_end)(void *ctx);
} ops_observer;
void ops_observe(const ops_observer *observer);   /* NULL: none */
/* A second, independent slot for a profiler, so that it can watch a thread that has an
 * observer of its own (DataParallel's lock). NULL: none. */
void ops_profile(const ops_observer *profiler);
/* Matrix multiplications and attention: the ops a framework runs as C/CUDA kernels. */
int op_is_kernel(op_kind kind);
/* For a backend: tell this thread's watchers that a matrix product begins / ends. */
void ops_gemm_begin(int trans_a, int trans_b, int M, int N, int K);
void ops_gemm_end(void);

/* For ops.c: whether this thread is watched, and an op beginning (with the bytes it
 * must at least read and write) and ending, told to its watchers. */
int ops_watched(void);
void ops_watch_begin(op_kind kind, double bytes);
void ops_watch_end(op_kind kind);

#endif
