/* Parts 6b and 6d on world rank 0's process: fp32 training for FP8_TRAIN_STEPS, then
 * fc2's product of the last block measured on its real activations (fp8_error.c) and
 * through an amax spike (fp8_spike.c). */
#include "mixed.h"

#include "baseline.h"
#include "device.h"

void fp8_local(const run_config *cfg, const dataset *data, fp8_report *r) {
    precision_case fp32 = {"fp32", PRECISION_FP32, PRECISION_FP32, 0};
    const run_config rc = mixed_case_config(cfg, &fp32, FP8_TRAIN_STEPS);
    baseline_run *trained = baseline_train(&rc, data);
    device_select(DEVICE_CPU, 0);   /* the host copy of the weights is read here */
    const gpt_shape s = gpt_shape_make(&cfg->model, 1, 0);
    const gpt_model_options opts = {.precision = PRECISION_FP32};
    r->layer = cfg->model.layers - 1;
    r->M = cfg->batch * cfg->model.ctx;
    r->K = s.hidden_local;
    r->N = cfg->model.dim;
    const fp8_source src = {gpt_model_create(&s, cfg->batch, cfg->model.ctx, &opts),
                            trained->final_params, data, &rc, r->K};
    float *slab = trained->final_params + gpt_slab_offset(&s, gpt_block_slab(&s, r->layer));
    const float *w = gpt_block_view(&s, slab).fc2_w;   /* [C, 4C] */
    fp8_measure_errors(&src, w, r);
    fp8_spike(&src, w, r);
    gpt_model_free(src.model);
    baseline_free(trained);
}
