#include "run_config.h"

#include "device.h"

run_config run_config_default(void) {
    run_config cfg = {
        .model = {.vocab = 256, .ctx = 64, .layers = 4, .heads = 4, .dim = 128},
        .batch = 8,
        .steps = 10,
        .seed = 1234,
        .adamw = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                  .weight_decay = 0.01f, .warmup_steps = 10},
        .comm = comm_options_default(),
        .fp8_recipe = FP8_BLOCKWISE,
        .fp8_amax_history = FP8_DEFAULT_HISTORY,
    };
    cfg.comm.device = DEVICE_AUTO;   /* settled by cli_parse */
    return cfg;
}
