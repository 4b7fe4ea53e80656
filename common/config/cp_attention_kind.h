/* How context parallelism carries attention across the sequence's chunks: ring attention
 * (K/V blocks passed round the cp ranks) or DeepSpeed-Ulysses (an all-to-all from
 * sequence-sharded to head-sharded and back). One enum and one spelling for the trainer
 * (cp_attention.h), the planner (plan_memory.h) and the command lines. */
#ifndef CP_ATTENTION_KIND_H
#define CP_ATTENTION_KIND_H

typedef enum { CP_RING, CP_ULYSSES } cp_attention_kind;

/* --cp-attention's values, by kind: "ring", "ulysses", then NULL */
extern const char *const cp_attention_names[];

#endif
