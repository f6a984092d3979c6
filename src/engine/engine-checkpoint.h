/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: what the engine offers its checkpoints (src/checkpoint/).
 *
 * The checkpoints are a part of their own, above the catalogue; the
 * engine calls their hooks (checkpoint.h: track, sync, the checkpoint
 * made with a snapshot), and they reach the engine's state only through
 * this interface, never through engine-internal.h:
 *
 *   - the chain the engine keeps for them (NULL until
 *     snapfg_checkpoints_open, and after checkpoint_chain_close);
 *   - the active bitmap, which every origin change marks first on the
 *     request path (engine-internal.h's engine_track_change): switched
 *     only while requests are held, or before the first and after the
 *     last;
 *   - holding every request off (the geometry write side, section 4 of
 *     docs/design.md), for the instant a checkpoint starts or stops
 *     tracking;
 *   - what a bitmap's binding and a merge's marks need of the origin and
 *     of a snapshot.
 */
#ifndef SNAPFG_ENGINE_CHECKPOINT_H
#define SNAPFG_ENGINE_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"

struct checkpoint_chain;
struct cbt_bitmap;

extern struct checkpoint_chain *snapfg_engine_checkpoints (struct snapfg_engine *e);
extern void snapfg_engine_set_checkpoints (struct snapfg_engine *e,
                                           struct checkpoint_chain *c);

/* The bitmap origin changes are marked in (NULL: none). */
extern struct cbt_bitmap *snapfg_engine_active_bitmap (struct snapfg_engine *e);
/* Switch it: with requests held (snapfg_engine_hold_requests), or while
 * none can run (opening, closing).
 */
extern void snapfg_engine_set_active_bitmap (struct snapfg_engine *e,
                                             struct cbt_bitmap *bm);

/* Hold every request off until the release: the requests in flight
 * finish first (the geometry write side).  Not from a request.
 */
extern void snapfg_engine_hold_requests (struct snapfg_engine *e);
extern void snapfg_engine_release_requests (struct snapfg_engine *e);

/* origin-moved=true: the origin's identity may differ from what the
 * records bound (store-binding.h).
 */
extern bool snapfg_origin_moved (struct snapfg_engine *e);

/* The origin chunks snapshot s holds (unsorted, to be freed) and its
 * chunk size.
 */
extern int snapfg_snapshot_remapped_chunks (struct snapfg_snapshot *s,
                                            uint64_t **chunks, size_t *n,
                                            uint32_t *chunk_size);

#endif
