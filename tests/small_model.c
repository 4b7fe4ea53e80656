#include "small_model.h"

#include "tolerances.h"

run_config small_model_config(int layers, int ranks) {
    run_config cfg = run_config_default();
    cfg.model = (gpt_config){.vocab = 256, .ctx = 8, .layers = layers, .heads = 2, .dim = 16};
    cfg.batch = 8;
    cfg.steps = 3;
    cfg.quiet = 1;
    cfg.comm.ranks = ranks;
    return cfg;
}

run_config uneven_model_config(int ranks) {
    run_config cfg = run_config_default();
    cfg.model = (gpt_config){.vocab = 256, .ctx = 7, .layers = 2, .heads = 5, .dim = 25};
    cfg.batch = 5;
    cfg.steps = 5;
    cfg.quiet = 1;
    cfg.comm.ranks = ranks;
    cfg.comm.timeout_seconds = 30;
    return cfg;
}

run_config sequence_model_config(int ranks) {
    run_config cfg = uneven_model_config(ranks);
    cfg.model = (gpt_config){.vocab = 256, .ctx = 8, .layers = 2, .heads = 12, .dim = 24};
    cfg.batch = 2;
    cfg.steps = TOL_STEPS;
    return cfg;
}
