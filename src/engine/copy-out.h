/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: copying origin chunks out into a snapshot's store before they
 * change (copy-out.c; the A -> B -> C -> D walk of docs/design.md
 * section 3).
 */
#ifndef SNAPFG_COPY_OUT_H
#define SNAPFG_COPY_OUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine-internal.h"

/* Copy origin chunk 'chunk' of snapshot s into its COW store and publish
 * the exception, unless it is already remapped.  'data', if not NULL, is a
 * snapshot write of 'count' bytes at 'offset_in_chunk' to be merged into
 * the copy (SNAPFG_ZERO_DATA: zeroes).  Returns 0 if the chunk is (now)
 * remapped and the write, if any, is done; 1 if the chunk was already
 * remapped and a write was NOT done (the caller takes the fast path);
 * -ENOSPC if the store is full, -EIO on an I/O error or Invalid snapshot.
 */
#define SNAPFG_ZERO_DATA ((const void *) 1)
extern int snapshot_copy_out (struct snapfg_snapshot *s, uint64_t chunk,
                              const void *data, uint32_t count,
                              uint32_t offset_in_chunk, uint64_t *new_chunk);

/* Copy out every chunk from 'first' to 'last' (inclusive) that snapshot s
 * does not hold yet, before an origin change: together, in batches (one
 * commit per batch, consecutive chunks in one read and one write).
 * With held (write-back: the held write the change is, opaque here),
 * the batches are handed to the engine's copy_deferral (the write-back
 * committer), which copies and commits them, and learns from
 * deferred_copy_each_read_failure which held writes lost a copy.
 * Returns 0 once every chunk is remapped (with held: claimed), -ENOSPC
 * if the store is full, -EIO if the snapshot is (or became) Invalid, or
 * the origin's read error.
 */
extern int snapshot_copy_out_range (struct snapfg_snapshot *s,
                                    uint64_t first, uint64_t last,
                                    void *held);

/* A batch of origin copy-outs handed to the write-back committer
 * (writeback_defer_copy): its chunks are claimed (state B) and have COW
 * chunks, nothing is copied yet.  The committer, for the list of a round
 * (linked by writeback.c through deferred_copy_link):
 *   1. deferred_copy_write: copies every batch of a valid snapshot.  A
 *      failed COW write makes the snapshot Invalid; a failed origin
 *      read leaves it valid and marks the chunks it could not copy,
 *      whose held write must then never reach the origin:
 *      deferred_copy_each_read_failure calls fn for each such batch's
 *      owner (the held write) with the error, while its snapshot is
 *      still valid;
 *   2. deferred_copy_publish: publishes and retires (B → C → D) the
 *      copied chunks of snapshots still valid, gives the others up
 *      (B → A):
 *      snapshot reads of the chunks go to their copies, written but not
 *      durable, and writers waiting for them go on, as with a copy-out
 *      whose commit is deferred;
 *   3. deferred_copy_commit: one commit per snapshot for all the pairs
 *      of the list (which may gather several rounds of steps 1-2);
 *      returns how many were committed;
 *   4. deferred_copy_free: returns the memory given back, as
 *      deferred_copy_size counted it.
 * Only after 3 may the held writes of those batches reach the origin.
 * deferred_copy_size is what one batch costs, its allocation's overhead
 * included: writeback-max counts it beside the held data.
 */
struct deferred_copy;
extern void deferred_copy_link (struct deferred_copy *dc,
                                struct deferred_copy *next);
extern void deferred_copy_write (struct deferred_copy *list);
extern void deferred_copy_each_read_failure (struct deferred_copy *list,
                                             void (*fn) (void *opaque,
                                                         void *owner,
                                                         int err),
                                             void *opaque);
extern void deferred_copy_publish (struct deferred_copy *list);
extern size_t deferred_copy_commit (struct deferred_copy *list);
extern uint64_t deferred_copy_free (struct deferred_copy *list);
extern uint64_t deferred_copy_size (const struct deferred_copy *dc);

#endif
