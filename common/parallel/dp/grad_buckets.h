/* DDP's gradient buckets: slabs grouped, in the order backward finishes them (last
 * block first), into buckets that are closed once they reach bucket_bytes (so a bucket
 * exceeds the cap by less than one slab, as PyTorch's exceed it by less than one
 * tensor), each all-reduced asynchronously the moment its last slab is final, so that
 * communication runs under the rest of the backward pass. As in PyTorch, the first
 * bucket has a smaller cap of its own (1 MiB there), so the first all-reduce starts
 * early.
 *
 * With a compressed wire type a bucket is encoded into a buffer of that type before
 * its all-reduce and decoded after it. fp16 and fp8 cannot hold raw gradients (too
 * small for fp16's and fp8's exponents, or, summed over ranks, too large for fp8's
 * 448), so those travel multiplied by a power of two agreed by all ranks: the largest
 * |g| over ranks (a one-float all-reduce MAX) times the rank count, brought just under
 * half the type's largest value. A power of two scales without rounding. The MAX runs
 * on a group of its own so that it does not queue behind the buckets in flight. */
#ifndef GRAD_BUCKETS_H
#define GRAD_BUCKETS_H
#include <stddef.h>

#include "comm.h"
#include "model.h"

typedef struct grad_buckets grad_buckets;

/* Plans the buckets over grads (the whole slab-ordered gradient vector). The
 * all-reduce SUMs: scale the loss so that the sum is the mean (dloss 1/global tokens). */
grad_buckets *grad_buckets_create(comm *group, const gpt_shape *s, float *grads,
                                  size_t first_bucket_bytes, size_t bucket_bytes,
                                  comm_dtype wire);
/* The same over gradients held in `held`: fp32 as above, or 16-bit gradients
 * (--grad-dtype bf16|fp16), all-reduced in their own type (the backend sums them in
 * fp32 and rounds, as NCCL does; wire is then ignored). Bucket caps count held bytes. */
grad_buckets *grad_buckets_create_held(comm *group, const gpt_shape *s, void *grads,
                                       comm_dtype held, size_t first_bucket_bytes,
                                       size_t bucket_bytes, comm_dtype wire);
void grad_buckets_free(grad_buckets *b);

/* gpt_backward's on_slab_ready: ctx is the grad_buckets. Starts a bucket's all-reduce
 * when its last slab arrives. */
void grad_buckets_slab_ready(void *ctx, int slab);
/* Waits for every started bucket and leaves the summed gradients in grads.
 * Every bucket must have been started (or none, when nothing was reduced). */
void grad_buckets_wait(grad_buckets *b);

/* This rank's traffic for the gradients: the buckets' all-reduces and, for fp16 and
 * fp8, the scale agreements (which run on a group of their own). Zero for NULL. */
comm_stats grad_buckets_stats(const grad_buckets *b);

/* The plan, for tables and tests: buckets in launch order. */
int grad_buckets_count(const grad_buckets *b);
size_t grad_buckets_numel(const grad_buckets *b, int bucket);
void grad_buckets_slabs(const grad_buckets *b, int bucket, int *first_slab, int *last_slab);

#endif
