#include "ddp_buckets.h"

#include <math.h>
#include <stdlib.h>

#include "alloc.h"
#include "ops.h"

/* Largest finite value of the wire types that need scaling (fp16, fp8 e4m3); 0 for
 * those that carry fp32's exponent range (fp32, bf16). */
static float scaled_wire_max(comm_dtype wire) {
    return wire == COMM_F16 ? 65504.0f : wire == COMM_F8E4M3 ? 448.0f : 0.0f;
}

typedef struct {
    int first_slab, last_slab;   /* covers slabs first..last: contiguous in memory */
    size_t offset, numel;        /* in the gradient vector */
    int slabs_pending;           /* slabs not yet final in this backward pass */
    void *wire_buffer;           /* the bucket in the wire type (compressed only) */
    float scale;                 /* what the gradients were multiplied by on the wire */
    comm_request *request;       /* in flight, or NULL */
} grad_bucket;

struct grad_buckets {
    comm *group;
    comm *scale_group;           /* fp16 / fp8: agrees on scales without queueing
                                    behind the buckets in flight on `group` */
    float *grads;
    comm_dtype wire;
    int count;
    grad_bucket *bucket;         /* in launch order: the last slabs first */
    int *bucket_of_slab;
};

grad_buckets *grad_buckets_create(comm *group, const gpt_shape *s, float *grads,
                                  size_t first_bucket_bytes, size_t bucket_bytes,
                                  comm_dtype wire) {
    const int slabs = gpt_num_slabs(s);
    grad_buckets *b = calloc(1, sizeof *b);
    b->group = group;
    b->grads = grads;
    b->wire = wire;
    b->bucket = calloc((size_t)slabs, sizeof *b->bucket);
    b->bucket_of_slab = calloc((size_t)slabs, sizeof *b->bucket_of_slab);

    /* Walk the slabs in the order backward finishes them, filling a bucket until it
     * reaches its cap (PyTorch's reducer does the same with tensors). */
    grad_bucket *open = NULL;
    for (int slab = slabs - 1; slab >= 0; slab--) {
        if (!open) {
            open = &b->bucket[b->count++];
            open->last_slab = slab;
        }
        open->first_slab = slab;
        open->offset = gpt_slab_offset(s, slab);
        open->numel += gpt_slab_numel(s, slab);
        b->bucket_of_slab[slab] = (int)(open - b->bucket);
        size_t cap = open == b->bucket ? first_bucket_bytes : bucket_bytes;
        if (open->numel * sizeof(float) >= cap) open = NULL;
    }
    if (scaled_wire_max(wire) > 0)
        b->scale_group = comm_split(group, 0, comm_rank(group), "grad-scale");
    for (int i = 0; i < b->count; i++) {
        grad_bucket *k = &b->bucket[i];
        k->slabs_pending = k->last_slab - k->first_slab + 1;
        if (wire != COMM_F32)
            k->wire_buffer =
                mem_alloc_on(MEM_DEVICE, MEM_COMM, k->numel * comm_dtype_size(wire));
    }
    return b;
}

void grad_buckets_free(grad_buckets *b) {
    if (!b) return;
    for (int i = 0; i < b->count; i++) mem_free(b->bucket[i].wire_buffer);
    comm_free(b->scale_group);
    free(b->bucket);
    free(b->bucket_of_slab);
    free(b);
}

/* The power of two that brings the largest sum over ranks just under half of the wire
 * type's largest value (1 when the bucket is all zeros). Every rank gets the same. */
static float agreed_scale(grad_buckets *b, const grad_bucket *k) {
    float largest = 0.0f;
    const float *g = b->grads + k->offset;
    for (size_t i = 0; i < k->numel; i++) largest = fmaxf(largest, fabsf(g[i]));
    comm_allreduce(b->scale_group, &largest, 1, COMM_F32, COMM_MAX);
    if (!(largest > 0.0f) || !isfinite(largest)) return 1.0f;
    double room = 0.5 * scaled_wire_max(b->wire) / ((double)largest * comm_size(b->group));
    return (float)exp2(floor(log2(room)));
}

static void start_bucket(grad_buckets *b, grad_bucket *k) {
    if (b->wire == COMM_F32) {
        k->request = comm_allreduce_start(b->group, b->grads + k->offset, k->numel,
                                          COMM_F32, COMM_SUM);
        return;
    }
    /* the fp32 gradients are overwritten by the result anyway: scale them in place */
    float *g = b->grads + k->offset;
    k->scale = scaled_wire_max(b->wire) > 0 ? agreed_scale(b, k) : 1.0f;
    if (k->scale != 1.0f) vec_scale(g, k->scale, k->numel);
    comm_convert(k->wire_buffer, b->wire, g, COMM_F32, k->numel);
    k->request = comm_allreduce_start(b->group, k->wire_buffer, k->numel, b->wire, COMM_SUM);
}

void grad_buckets_slab_ready(void *ctx, int slab) {
    grad_buckets *b = ctx;
    grad_bucket *k = &b->bucket[b->bucket_of_slab[slab]];
    if (--k->slabs_pending == 0) start_bucket(b, k);
}

void grad_buckets_wait(grad_buckets *b) {
    for (int i = 0; i < b->count; i++) {
        grad_bucket *k = &b->bucket[i];
        if (k->request) {
            comm_wait(k->request);
            k->request = NULL;
            if (b->wire != COMM_F32) {
                float *g = b->grads + k->offset;
                comm_convert(g, COMM_F32, k->wire_buffer, b->wire, k->numel);
                if (k->scale != 1.0f) vec_scale(g, 1.0f / k->scale, k->numel);   /* exact */
            }
        } else if (k->slabs_pending != k->last_slab - k->first_slab + 1) {
            comm_abort(b->group, "DDP bucket %d (slabs %d..%d) was never started: %d slabs "
                       "did not report ready", i, k->first_slab, k->last_slab,
                       k->slabs_pending);
        }
        k->slabs_pending = k->last_slab - k->first_slab + 1;   /* ready for the next pass */
    }
}

int grad_buckets_count(const grad_buckets *b) { return b->count; }

comm_stats grad_buckets_stats(const grad_buckets *b) {
    comm_stats s = comm_stats_get(b->group);
    if (b->scale_group) {
        comm_stats extra = comm_stats_get(b->scale_group);
        for (int k = 0; k < COMM_NKINDS; k++) {
            s.calls[k] += extra.calls[k];
            s.bytes_sent[k] += extra.bytes_sent[k];
            s.bytes_received[k] += extra.bytes_received[k];
            s.seconds[k] += extra.seconds[k];
        }
    }
    return s;
}

size_t grad_buckets_numel(const grad_buckets *b, int bucket) {
    return b->bucket[bucket].numel;
}

void grad_buckets_slabs(const grad_buckets *b, int bucket, int *first_slab, int *last_slab) {
    *first_slab = b->bucket[bucket].first_slab;
    *last_slab = b->bucket[bucket].last_slab;
}
