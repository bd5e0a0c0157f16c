/* graph.h: the graph pool's internal face: one slot per (mode, bucket) and its lifetime.
 * The public calls (fattn_graph_capture, fattn_graph_launch) are in fattn.h. */
#ifndef FATTN_GRAPH_GRAPH_H
#define FATTN_GRAPH_GRAPH_H

#include "lib/internal.h"

fattn_status fattn__graphs_init(fattn_ctx *ctx);
void fattn__graphs_close(fattn_ctx *ctx);

#endif /* FATTN_GRAPH_GRAPH_H */
