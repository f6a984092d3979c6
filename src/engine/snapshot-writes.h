/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: which of a snapshot's exceptions only its own writes made,
 * so that "changed NAME" lists origin changes and nothing else.
 *
 * A write to a writable snapshot copies the chunk out like an origin
 * write does, and the exception table cannot tell the two apart.  A
 * snapshot's first write (io-snapshot.c) makes two bitmaps of its
 * chunks: "snap", the chunks whose exception that snapshot's own write
 * made, and "origin", the chunks the origin changed since the bitmaps
 * exist (io-origin.c, after the change's copy-outs).  A chunk the
 * snapshot wrote and the origin did not is no origin change.
 *
 * Why the order is enough: a snapshot write makes the bitmaps, then (a
 * full fence) looks whether the chunk is remapped already, and marks
 * "snap" only if it was not and its copy-out succeeded; an origin change
 * publishes its exceptions, then (a full fence) looks for the bitmaps
 * and marks "origin".  With the two fences, either the origin change
 * finds the bitmaps (and its mark keeps the chunk listed), or the
 * snapshot write finds the origin's exception (and marks nothing).  An
 * exception the snapshot's own copy-out published is seen by a later
 * origin change of that chunk, and the bitmaps with it.
 *
 * The bitmaps are in memory only: after a restart every exception counts
 * as an origin change again (the safe side: an incremental copies a
 * chunk more, never one less).
 */
#ifndef SNAPFG_SNAPSHOT_WRITES_H
#define SNAPFG_SNAPSHOT_WRITES_H

#include <stdbool.h>
#include <stdint.h>

struct snapfg_engine;
struct snapfg_snapshot;

struct snapshot_writes {
  uint64_t words;               /* per bitmap */
  _Atomic uint64_t *snap;       /* bits[0 .. words) */
  _Atomic uint64_t *origin;     /* bits[words .. 2 * words) */
  _Atomic uint64_t bits[];
};

/* Before a write to S copies out: its bitmaps, made if need be.  False
 * when there is no memory for them (the write's exceptions then count
 * as origin changes).
 */
extern bool snapshot_writes_prepare (struct snapfg_snapshot *s);
/* S's own write made CHUNK's exception. */
extern void snapshot_writes_mark_snapshot (struct snapfg_snapshot *s,
                                           uint64_t chunk);
/* The origin's [offset, offset+count) changed, its copy-outs done (with
 * the geometry read side held).
 */
extern void snapshot_writes_mark_origin (struct snapfg_engine *e,
                                         uint64_t offset, uint64_t count);
/* Is CHUNK's exception S's own write's, with no origin change since? */
extern bool snapshot_writes_only_snapshot (struct snapfg_snapshot *s,
                                           uint64_t chunk);
extern void snapshot_writes_free (struct snapfg_snapshot *s);

#endif
