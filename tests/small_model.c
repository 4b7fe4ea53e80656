#include "small_model.h"

run_config small_model_config(int layers, int ranks) {
    run_config cfg = run_config_default();
    cfg.model = (gpt_config){.vocab = 256, .ctx = 8, .layers = layers, .heads = 2, .dim = 16};
    cfg.batch = 8;
    cfg.steps = 3;
    cfg.quiet = 1;
    cfg.comm.ranks = ranks;
    return cfg;
}
