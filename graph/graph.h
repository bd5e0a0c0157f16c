/* graph.h: the graph pool's internal face: one slot per (mode, bucket) and its lifetime.
 * The public calls (fattn_graph_capture / launch, and begin / end / plan) are in fattn.h. */
#ifndef FATTN_GRAPH_GRAPH_H
#define FATTN_GRAPH_GRAPH_H

#include "attn/plan.h"

fattn_status fattn__graphs_init(fattn_ctx *ctx);
void fattn__graphs_close(fattn_ctx *ctx);
/* The first half of fattn_graph_launch: the batch's captured graph (cudaGraphExec_t) and the
 * plan target of its bucket; fails as fattn_graph_launch does. fattn-bench times the halves. */
fattn_status fattn__graph_for(fattn_ctx *ctx, const fattn_batch *batch, void **exec, fattn__plan_target *target);

#endif /* FATTN_GRAPH_GRAPH_H */
