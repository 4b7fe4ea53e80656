/* AdamW's settings, apart from the ops that use them, so that the CPU and GPU
 * implementations and the run's configuration share the type without the dispatcher. */
#ifndef ADAMW_CONFIG_H
#define ADAMW_CONFIG_H

/* The learning rate rises linearly over the first warmup_steps steps (0: none): early
 * Adam steps, with second moments estimated from a few gradients, are what makes a
 * loss spike, and a spike would magnify harmless rounding differences between
 * strategies. */
typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    int warmup_steps;
} adamw_config;

#endif
