#include "grad_buckets.h"

#include <math.h>
#include <stdlib.h>

#include "alloc.h"
#include "ops.h"

/* Largest finite value of the wire types that need scaling (fp16, fp8 e4m3); 0 for
 * those that carry fp32's exponent range (fp32, bf16). */
static float scaled_wire_max(comm_dtype wire) {
    return wire == COMM_F16 ? 65504.0f : wire == COMM_F8E4M3 ? 448.0f : 0.0f;
}

/* The gradients may live on a device, but the conversion to and from the wire type
 * runs on the host (comm_convert), and the wire buffers are host memory (which every
 * backend accepts). So compressed buckets pass through one host staging buffer, piece
 * by piece: a piece small enough to stay in cache makes the extra copy (a memcpy on a
 * CPU rank) nearly free, since the conversion then reads it from cache. */
enum { STAGING_FLOATS = 1 << 16 };   /* 256 KiB */

typedef struct {
    int first_slab, last_slab;   /* covers slabs first..last: contiguous in memory */
    size_t offset, numel;        /* in the gradient vector */
    int slabs_pending;           /* slabs not yet final in this backward pass */
    void *wire_buffer;           /* the bucket in the wire type, host (compressed only) */
    float scale;                 /* what the gradients were multiplied by on the wire */
    comm_request *request;       /* in flight, or NULL */
} grad_bucket;

struct grad_buckets {
    comm *group;
    comm *scale_group;           /* fp16 / fp8: agrees on scales without queueing
                                    behind the buckets in flight on `group` */
    void *grads;
    comm_dtype held;             /* the gradient vector's type: fp32, or 16-bit gradients
                                    (--grad-dtype), all-reduced as they are */
    comm_dtype wire;
    int count;
    grad_bucket *bucket;         /* in launch order: the last slabs first */
    int *bucket_of_slab;
    float *staging;              /* host, staging_numel floats (compressed only) */
    size_t staging_numel;
};

grad_buckets *grad_buckets_create(comm *group, const gpt_shape *s, float *grads,
                                  size_t first_bucket_bytes, size_t bucket_bytes,
                                  comm_dtype wire) {
    return grad_buckets_create_held(group, s, grads, COMM_F32, first_bucket_bytes,
                                    bucket_bytes, wire);
}

grad_buckets *grad_buckets_create_held(comm *group, const gpt_shape *s, void *grads,
                                       comm_dtype held, size_t first_bucket_bytes,
                                       size_t bucket_bytes, comm_dtype wire) {
    if (held != COMM_F32) wire = held;   /* 16-bit gradients travel as they are */
    const int slabs = gpt_num_slabs(s);
    grad_buckets *b = mem_alloc(MEM_OTHER, sizeof *b);   /* freed with a stopped rank */
    b->group = group;
    b->grads = grads;
    b->held = held;
    b->wire = wire;
    b->bucket = mem_alloc(MEM_OTHER, (size_t)slabs * sizeof *b->bucket);
    b->bucket_of_slab = mem_alloc(MEM_OTHER, (size_t)slabs * sizeof *b->bucket_of_slab);

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
        if (open->numel * comm_dtype_size(held) >= cap) open = NULL;
    }
    if (scaled_wire_max(wire) > 0)
        b->scale_group = comm_split(group, 0, comm_rank(group), "grad-scale");
    for (int i = 0; i < b->count; i++) {
        grad_bucket *k = &b->bucket[i];
        k->slabs_pending = k->last_slab - k->first_slab + 1;
        if (wire != held) {
            k->wire_buffer = mem_alloc(MEM_COMM, k->numel * comm_dtype_size(wire));
            if (k->numel > b->staging_numel) b->staging_numel = k->numel;
        }
    }
    if (b->staging_numel > STAGING_FLOATS) b->staging_numel = STAGING_FLOATS;
    if (wire != held) b->staging = mem_alloc(MEM_COMM, b->staging_numel * sizeof(float));
    return b;
}

void grad_buckets_free(grad_buckets *b) {
    if (!b) return;
    for (int i = 0; i < b->count; i++) mem_free(b->bucket[i].wire_buffer);
    mem_free(b->staging);
    comm_free(b->scale_group);
    mem_free(b->bucket);
    mem_free(b->bucket_of_slab);
    mem_free(b);
}

/* Elements of the piece of bucket k that starts at element `done`. */
static size_t piece_numel(const grad_buckets *b, const grad_bucket *k, size_t done) {
    const size_t left = k->numel - done;
    return left < b->staging_numel ? left : b->staging_numel;
}

/* The power of two that brings the largest sum over ranks just under half of the wire
 * type's largest value (1 when the bucket is all zeros). Every rank gets the same.
 * Leaves the bucket's last piece in the staging buffer. */
/* The fp32 gradients a compressed wire encodes (held fp32 then). */
static float *f32_grads(const grad_buckets *b) { return b->grads; }

static float agreed_scale(grad_buckets *b, const grad_bucket *k) {
    float largest = 0.0f;
    for (size_t done = 0; done < k->numel; done += b->staging_numel) {
        const size_t n = piece_numel(b, k, done);
        ops_download(b->staging, f32_grads(b) + k->offset + done, n * sizeof(float));
        for (size_t i = 0; i < n; i++) largest = fmaxf(largest, fabsf(b->staging[i]));
    }
    comm_allreduce(b->scale_group, &largest, 1, COMM_F32, COMM_MAX);
    if (!(largest > 0.0f) || !isfinite(largest)) return 1.0f;
    double room = 0.5 * scaled_wire_max(b->wire) / ((double)largest * comm_size(b->group));
    return (float)exp2(floor(log2(room)));
}

static void start_bucket(grad_buckets *b, grad_bucket *k) {
    if (b->wire == b->held) {   /* fp32, or 16-bit gradients: reduced where they are */
        void *at = (char *)b->grads + k->offset * comm_dtype_size(b->held);
        k->request = comm_allreduce_start(b->group, at, k->numel, b->held, COMM_SUM);
        return;
    }
    const int scaled = scaled_wire_max(b->wire) > 0;
    k->scale = scaled ? agreed_scale(b, k) : 1.0f;
    /* a bucket of one piece is in the staging buffer already when its scale was found */
    const int staged = scaled && k->numel <= b->staging_numel;
    const size_t wire_size = comm_dtype_size(b->wire);
    for (size_t done = 0; done < k->numel; done += b->staging_numel) {
        const size_t n = piece_numel(b, k, done);
        float *piece = b->staging;
        if (!staged) ops_download(piece, f32_grads(b) + k->offset + done, n * sizeof(float));
        if (k->scale != 1.0f)
            for (size_t i = 0; i < n; i++) piece[i] *= k->scale;
        comm_convert((char *)k->wire_buffer + done * wire_size, b->wire, piece, COMM_F32, n);
    }
    k->request = comm_allreduce_start(b->group, k->wire_buffer, k->numel, b->wire, COMM_SUM);
}

/* The reduced bucket back from the wire type into the fp32 gradients. */
static void finish_bucket(grad_buckets *b, const grad_bucket *k) {
    const size_t wire_size = comm_dtype_size(b->wire);
    const float unscale = 1.0f / k->scale;   /* a power of two: exact */
    for (size_t done = 0; done < k->numel; done += b->staging_numel) {
        const size_t n = piece_numel(b, k, done);
        float *piece = b->staging;
        comm_convert(piece, COMM_F32, (const char *)k->wire_buffer + done * wire_size,
                     b->wire, n);
        if (k->scale != 1.0f)
            for (size_t i = 0; i < n; i++) piece[i] *= unscale;
        ops_upload(f32_grads(b) + k->offset + done, piece, n * sizeof(float));
    }
}

/* Whether an earlier bucket's all-reduce may still be on its way. */
static int any_in_flight(const grad_buckets *b, const grad_bucket *before) {
    for (const grad_bucket *k = b->bucket; k < before; k++)
        if (k->request) return 1;
    return 0;
}

void grad_buckets_slab_ready(void *ctx, int slab) {
    grad_buckets *b = ctx;
    grad_bucket *k = &b->bucket[b->bucket_of_slab[slab]];
    /* Open MPI moves a nonblocking all-reduce only inside an MPI call of this rank's:
     * without one here, the buckets in flight would wait for the next bucket's start
     * or for grad_buckets_wait, behind the rest of backward (a no-op on threads) */
    if (any_in_flight(b, k)) comm_progress(b->group);
    if (--k->slabs_pending == 0) start_bucket(b, k);
}

void grad_buckets_wait(grad_buckets *b) {
    for (int i = 0; i < b->count; i++) {
        grad_bucket *k = &b->bucket[i];
        if (k->request) {
            comm_wait(k->request);
            k->request = NULL;
            if (b->wire != b->held) finish_bucket(b, k);
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
    if (!b) return (comm_stats){0};
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
