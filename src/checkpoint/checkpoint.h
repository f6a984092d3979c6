/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: checkpoints — changed-block tracking without a snapshot
 * (docs/design.md section 8).
 *
 * A checkpoint is a persistent dirty bitmap of the origin (cbt-bitmap.h)
 * started at one instant.  Checkpoints form a chain in creation order;
 * only the newest one is active (tracks origin changes).  Creating a
 * checkpoint freezes the previous one at the same instant, under the
 * geometry write lock, so every origin change lands in exactly one
 * bitmap of the chain:
 *
 *   changed since A          = A | A+1 | ... | newest
 *   changed from A to S      = A | ... | (the one before S's checkpoint)
 *
 * where S's checkpoint is the one created together with snapshot S.
 * Dropping a checkpoint ORs its bits into its predecessor first (which
 * becomes active again if the dropped one was), so the queries from
 * older checkpoints stay exact.  A query whose union holds an
 * inconsistent bitmap is refused: a full backup is needed.
 *
 * Checkpoints are recorded in the catalogue (state=, catalogue.h) and
 * their bitmaps live in its state directory as NAME.cbt.
 *
 * Locks, outermost first: chain->lock (commands, one at a time), the
 * geometry write lock, chain->io_lock (held around the few bitmap
 * changes made without the geometry read side: the merge thread's
 * copying, and the switches that must not race with it).  The request
 * path takes none of them: it marks the active bitmap under the
 * geometry read side.
 */
#ifndef SNAPFG_CHECKPOINT_H
#define SNAPFG_CHECKPOINT_H

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"

struct catalogue;
struct checkpoint;

/* Open the chain recorded in cat (NULL: no state=, checkpoint commands
 * are refused) with granularity for new checkpoints.  A bitmap that is
 * missing, unreadable, or was in use when the system stopped uncleanly
 * makes its checkpoint inconsistent (logged, recorded); that is not an
 * error.  Call once, before any request.
 */
extern int snapfg_checkpoints_open (struct snapfg_engine *e,
                                    struct catalogue *cat,
                                    uint32_t granularity);

/* The run-time commands.  Errors are logged with a message naming the
 * checkpoint and saying what to do.
 */
extern int snapfg_checkpoint_create (struct snapfg_engine *e,
                                     const char *name);
extern int snapfg_checkpoint_drop (struct snapfg_engine *e, const char *name);

struct snapfg_checkpoint_info {
  const char *name;
  const char *state;               /* "active", "frozen", "inconsistent" */
  const char *snapshot;            /* created with this snapshot, or NULL */
  const char *owner;               /* who made it (create's
                                      checkpoint_owner), or NULL */
  const char *bitmap;              /* path of the bitmap file */
  uint32_t granularity;
  int64_t created;                 /* Unix seconds */
  uint64_t seq;
  uint64_t dirty_bytes;            /* bytes its own bitmap marks */
};
typedef int (*snapfg_checkpoint_fn) (void *opaque,
                                     const struct snapfg_checkpoint_info *);
/* Every checkpoint, oldest first. */
extern int snapfg_checkpoint_list (struct snapfg_engine *e,
                                   snapfg_checkpoint_fn fn, void *opaque);

/* The origin ranges changed since checkpoint 'since' (up to now, or,
 * with snapshot != NULL, up to the instant of that snapshot, which must
 * have been created with a checkpoint), merged into extents, in order,
 * clipped to the origin's size.  *granularity is the unit of the ranges.
 * Refused (-ESTALE, logged with "a full backup is needed") when a bitmap
 * of the union is inconsistent.
 */
extern int snapfg_checkpoint_changed (struct snapfg_engine *e,
                                      const char *since,
                                      const char *snapshot,
                                      uint32_t *granularity,
                                      snapfg_range_fn fn, void *opaque);

/* --- for the engine --- */

/* Close every bitmap; clean: the server stops cleanly (bitmaps are synced
 * and marked clean).
 */
extern void checkpoint_chain_close (struct snapfg_engine *e, bool clean);

/* A checkpoint to be created together with a snapshot: prepared (its
 * bitmap file made) before the geometry write lock, committed under it
 * (the previous checkpoint frozen, the catalogue rewritten), finished
 * after it.  Abandon it instead of committing if the snapshot fails.
 */
extern int checkpoint_prepare (struct snapfg_engine *e, const char *name,
                               const char *snapshot,
                               struct checkpoint **cpp);
/* Who made it (control create's checkpoint_owner, e.g. snapfg-backup's
 * HOST:DIR), recorded with it and shown by checkpoint list.
 */
extern int checkpoint_set_owner (struct checkpoint *cp, const char *owner);
extern int checkpoint_commit_locked (struct snapfg_engine *e,
                                     struct checkpoint *cp);
extern void checkpoint_finish (struct snapfg_engine *e,
                               struct checkpoint *cp);
extern void checkpoint_abandon (struct snapfg_engine *e,
                                struct checkpoint *cp);

/* A new snapshot is about to take this name: checkpoints that recorded
 * an older snapshot of the same name no longer mark "its" instant
 * (changed --since A NAME would otherwise answer for the old one).
 */
extern void checkpoint_forget_snapshot (struct snapfg_engine *e,
                                        const char *snapshot);

/* The origin's [offset, offset+count) is about to change, from a thread
 * that does not hold the geometry read side (the merge thread).
 */
extern void checkpoint_track_unlocked (struct snapfg_engine *e,
                                       uint64_t offset, uint64_t count);
/* Snapshot s's chunks are about to change in the origin view (a merge
 * begins), with the geometry write side held.
 */
extern void checkpoint_track_snapshot_locked (struct snapfg_engine *e,
                                              struct snapfg_snapshot *s);
/* Make the active bitmap durable (before the origin's flush). */
extern int checkpoint_sync (struct snapfg_engine *e);

#endif
