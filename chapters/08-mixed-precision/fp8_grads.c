/* Part 6c, the formats: the step-1 gradients of one training step, one rank, the same
 * batch, in bf16 and under each FP8 recipe in e4m3 (the backward's products in bf16) and
 * hybrid (Transformer Engine's: the backward's products on E5M2 output gradients and
 * E4M3 weights and inputs), against fp32's: ||g - g_fp32|| / ||g_fp32|| over every
 * parameter. What E5M2's 2 mantissa bits cost the gradient, next to E4M3's forward. */
#include "mixed.h"

#include <math.h>
#include <stdio.h>

#include "baseline.h"
#include "fp8_linear.h"

/* One step's gradients in precision p, FP8 under recipe and format when fp8. */
static baseline_run *one_step(const run_config *cfg, const dataset *data, precision p,
                              int fp8, fp8_recipe recipe, fp8_training_format format) {
    const precision_case c = {fp8 ? "fp8" : precision_name(p), p, PRECISION_FP32, 0};
    run_config rc = mixed_case_config(cfg, &c, 1);
    rc.fp8 = fp8;
    rc.fp8_recipe = recipe;
    rc.fp8_format = (int)format;
    fp8_linear_format(format);
    fp8_linear_use(fp8 ? &recipe : NULL);
    baseline_run *b = baseline_train(&rc, data);
    fp8_linear_use(NULL);
    fp8_linear_format(FP8_FORMAT_E4M3);
    return b;
}

static double relative_error(const baseline_run *b, const baseline_run *ref) {
    double d = 0, n = 0;
    for (size_t i = 0; i < ref->num_params; i++) {
        const double g = ref->first_grads[i];
        d += (b->first_grads[i] - g) * (b->first_grads[i] - g);
        n += g * g;
    }
    return n > 0 ? sqrt(d / n) : 0;
}

void fp8_gradient_errors(const run_config *cfg, const dataset *data, fp8_report *r) {
    baseline_run *ref = one_step(cfg, data, PRECISION_FP32, 0, FP8_BLOCKWISE, FP8_FORMAT_E4M3);
    baseline_run *b16 = one_step(cfg, data, PRECISION_BF16, 0, FP8_BLOCKWISE, FP8_FORMAT_E4M3);
    r->grad_error_bf16 = relative_error(b16, ref);
    baseline_free(b16);
    for (int recipe = 0; recipe < FP8_RECIPES; recipe++)
        for (int f = 0; f < FP8_TRAINING_FORMATS; f++) {
            baseline_run *b = one_step(cfg, data, PRECISION_BF16, 1, (fp8_recipe)recipe,
                                       (fp8_training_format)f);
            r->grad_error[recipe][f] = relative_error(b, ref);
            baseline_free(b);
        }
    baseline_free(ref);
}

void fp8_gradient_errors_print(const fp8_report *r) {
    printf("\nThe formats: step 1's gradients against fp32's, ||g - g_fp32|| / ||g_fp32||, one"
           " rank, the same batch\n%-12s %10s %10s\n", "recipe", "e4m3", "hybrid");
    for (int recipe = 0; recipe < FP8_RECIPES; recipe++)
        printf("%-12s %10.4f %10.4f\n", fp8_recipe_name((fp8_recipe)recipe),
               r->grad_error[recipe][FP8_FORMAT_E4M3], r->grad_error[recipe][FP8_FORMAT_HYBRID]);
    printf("(bf16: %.4f; e4m3: the forward's products in FP8, the backward's in bf16; hybrid"
           " (--fp8-format\n hybrid): the backward's too, the output gradients in E5M2, W and X"
           " in E4M3)\n", r->grad_error_bf16);
}

void fp8_gradient_errors_json(FILE *o, const fp8_report *r) {
    fprintf(o, "\"gradients\": {\"bf16\": %.6e, \"rows\": [", r->grad_error_bf16);
    for (int recipe = 0; recipe < FP8_RECIPES; recipe++)
        fprintf(o, "%s\n  {\"recipe\": \"%s\", \"e4m3\": %.6e, \"hybrid\": %.6e}",
                recipe ? "," : "", fp8_recipe_name((fp8_recipe)recipe),
                r->grad_error[recipe][FP8_FORMAT_E4M3], r->grad_error[recipe][FP8_FORMAT_HYBRID]);
    fprintf(o, "]}");
}
