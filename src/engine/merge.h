/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: merging a snapshot back into the origin (merge.c). */
#ifndef SNAPFG_MERGE_H
#define SNAPFG_MERGE_H

#include <stdint.h>

#include "engine-internal.h"

/* Origin requests while a snapshot is being merged (merge.c): chunks
 * not yet merged are read from and written to the COW store.  op is one
 * an origin_op.  Called with the geometry read side held.
 */
extern int merge_origin_io (struct snapfg_engine *e, enum origin_op op,
                            void *buf, uint32_t count, uint64_t offset,
                            unsigned flags);
/* Start the merge thread of a snapshot in state SNAPSHOT_MERGING. */
extern int merge_start_thread (struct snapfg_snapshot *s);
/* Stop and join a merge thread (engine close). */
extern void merge_stop_thread (struct snapfg_snapshot *s);

/* merge.c: mark a snapshot as merging (store mark, catalogue, origin
 * routing) with the geometry write side held; NULL or a problem.
 */
extern const char *merge_prepare_locked (struct snapfg_engine *e,
                                         struct snapfg_snapshot *s, int *r);

#endif
