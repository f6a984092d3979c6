/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: copying origin chunks out into a snapshot's store before they
 * change (copy-out.c; the A -> B -> C -> D walk of docs/design.md
 * section 3).
 */
#ifndef SNAPFG_COPY_OUT_H
#define SNAPFG_COPY_OUT_H

#include <stdbool.h>
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
 * With defer (write-back), the commit is left to the committer
 * (writeback_defer_commit) instead of waited for.
 * Returns 0 once every chunk is remapped, -ENOSPC if the store is full,
 * -EIO if the snapshot is (or became) Invalid, or the origin's read
 * error.
 */
extern int snapshot_copy_out_range (struct snapfg_snapshot *s,
                                    uint64_t first, uint64_t last,
                                    bool defer);


#endif
