/* The CUDA backend as common/ sees it: one device_backend table (device.h) holding the
 * device layer, the ops (ops.h's ops_table), the 16-bit ops (ops_mixed_table.h) and the
 * communicator hooks (comm_internal.h).
 * A GPU=1 build links this in place of common/device_cpu.c. */
#include "comm_gpu.h"
#include "device.h"
#include "ops.h"
#include "ops_cuda.h"
#include "ops_cuda_mixed.h"
#include "ops_mixed_table.h"

static const ops_table cuda_ops = {
    .embedding_forward = cuda_embedding_forward,
    .embedding_backward = cuda_embedding_backward,
    .position_forward = cuda_position_forward,
    .position_backward = cuda_position_backward,
    .layernorm_forward = cuda_layernorm_forward,
    .layernorm_backward = cuda_layernorm_backward,
    .linear_forward = cuda_linear_forward,
    .linear_backward = cuda_linear_backward,
    .attention_forward = cuda_attention_forward,
    .attention_backward = cuda_attention_backward,
    .gelu_forward = cuda_gelu_forward,
    .gelu_backward = cuda_gelu_backward,
    .crossentropy_forward = cuda_crossentropy_forward,
    .crossentropy_backward = cuda_crossentropy_backward,
    .adamw_update = cuda_adamw_update,
    .vec_zero = cuda_vec_zero,
    .vec_copy = cuda_vec_copy,
    .vec_add = cuda_vec_add,
    .residual_forward = cuda_residual_forward,
    .vec_scale = cuda_vec_scale,
    .vec_sum = cuda_vec_sum,
    .ops_upload = cuda_ops_upload,
    .ops_download = cuda_ops_download,
    .ops_synchronize = cuda_ops_synchronize,
};

static const mixed_ops_table cuda_mixed_ops = {
    .round = cuda_mixed_round,
    .widen = cuda_mixed_widen,
    .embedding_forward = cuda_mixed_embedding_forward,
    .embedding_backward = cuda_mixed_embedding_backward,
    .position_forward = cuda_mixed_position_forward,
    .position_backward = cuda_mixed_position_backward,
    .layernorm_forward = cuda_mixed_layernorm_forward,
    .layernorm_backward = cuda_mixed_layernorm_backward,
    .linear_forward = cuda_mixed_linear_forward,
    .linear_backward = cuda_mixed_linear_backward,
    .attention_forward = cuda_mixed_attention_forward,
    .attention_backward = cuda_mixed_attention_backward,
    .gelu_forward = cuda_mixed_gelu_forward,
    .gelu_backward = cuda_mixed_gelu_backward,
    .crossentropy_forward = cuda_mixed_crossentropy_forward,
    .crossentropy_backward = cuda_mixed_crossentropy_backward,
    .vec_zero = cuda_mixed_vec_zero,
    .vec_copy = cuda_mixed_vec_copy,
    .vec_add = cuda_mixed_vec_add,
    .vec_finite = cuda_mixed_vec_finite,
    .adamw_update = cuda_mixed_adamw_update,
    .round_in_place = cuda_mixed_round_in_place,
};

static const comm_gpu_hooks cuda_comm = {
    .open = comm_cuda_open,
    .close = comm_cuda_close,
    .is_device = comm_cuda_is_device,
    .copy = comm_cuda_copy,
    .reduce = comm_cuda_reduce,
    .divide = comm_cuda_divide,
    .compute_done = comm_cuda_compute_done,
    .compute_mark = comm_cuda_compute_mark,
    .wait_mark = comm_cuda_wait_mark,
    .nccl_unique_id = nccl_backend_unique_id,
    .nccl_world = nccl_backend_world,
    .nccl_run_rank = nccl_backend_run_rank,
};

static const device_backend cuda_backend = {
    .name = "cuda",
    .gpu_count = cuda_gpu_count,
    .select = cuda_select,
    .malloc = cuda_device_malloc,
    .free = cuda_device_free,
    .set_tf32 = cuda_set_tf32,
    .gpu_name = cuda_device_name,
    .ops = &cuda_ops,
    .mixed = &cuda_mixed_ops,
    .comm = &cuda_comm,
};

const device_backend *device_gpu_backend(void) { return &cuda_backend; }
