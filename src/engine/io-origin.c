/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: requests on the origin view.
 *
 * Every request that changes origin data (write, zero, trim) first makes
 * sure each valid snapshot holds the old contents of every chunk it
 * touches (copy-out), then changes the origin.  With no snapshot, or
 * with every chunk already remapped, that is one stripe lookup per chunk
 * and snapshot, and the data I/O.
 */

#include <config.h>

#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>

#include "engine-internal.h"
#include "snapshot-writes.h"
#include "copy-out.h"
#include "merge.h"
#include "checkpoint.h"
#include "snapfg-log.h"

int
snapfg_origin_pread (struct snapfg_engine *e, void *buf, uint32_t count,
                     uint64_t offset)
{
  /* Origin reads consult no snapshot, but every request holds the read
   * side so that a geometry change waits for all in-flight I/O.
   */
  uint64_t start = stats_now_ns ();
  percpu_rwlock_token token = percpu_rwlock_read_lock (&e->geometry);
  struct held_view held;
  int r;

  /* Held writes are taken before the origin is read: one the committer
   * applies meanwhile is then either in what the origin returns or laid
   * over it (read-your-writes on every connection).
   */
  r = writeback_read_begin (e, count, offset, &held);
  if (r < 0) {
    snapfg_error ("origin=%s: read at %" PRIu64 " failed: no memory for "
                  "the list of held writes over it", e->origin.path, offset);
    goto out;
  }
  r = e->merging
    ? merge_origin_io (e, ORIGIN_READ, buf, count, offset, 0)
    : device_pread (&e->origin, buf, count, offset);
  if (writeback_read_end (e, &held, buf, count, offset, r == 0) < 0)
    r = -EIO;                   /* logged */
  else if (r < 0 && !engine_origin_shrunk (e, r, offset + count))
    snapfg_error ("origin=%s: read at %" PRIu64 " failed: %s",
                  e->origin.path, offset, strerror (-r));
 out:
  percpu_rwlock_read_unlock (&e->geometry, token);
  stats_request (&e->stats, start, STAT_BYTES_READ, count, r);
  return r;
}

/* Would changing [offset, offset+count) need a copy-out in any snapshot
 * (with syncing_only, in any whose store's commit waits for the disk)?
 * (Read-only: used to refuse fast zero requests and to decide whether
 * write-back holds the change.)
 */
static bool
needs_copy_out (struct snapfg_engine *e, uint32_t count, uint64_t offset,
                bool syncing_only)
{
  for (size_t i = 0; i < e->nsnapshots; ++i) {
    struct snapfg_snapshot *s = e->snapshots[i];
    uint64_t first = offset >> s->chunk_shift;
    uint64_t last = (offset + count - 1) >> s->chunk_shift;

    if (!snapshot_is_valid (s) || (syncing_only && !s->store->commit_syncs))
      continue;
    for (uint64_t chunk = first; chunk <= last; ++chunk)
      if (!snapshot_chunk_is_remapped (s, chunk))
        return true;
  }
  return false;
}

/* Copy out every chunk of [offset, offset+count) into every valid
 * snapshot that does not hold it yet (with held, the change's held
 * write: leave the copies to the write-back committer).  A snapshot
 * whose store is full or failed becomes Invalid and the origin change
 * goes ahead (docs/design.md section 6); an origin read error is
 * returned to the client.
 */
static int
prepare_origin_change (struct snapfg_engine *e, uint32_t count,
                       uint64_t offset, struct held_write *held)
{
  for (size_t i = 0; i < e->nsnapshots; ++i) {
    struct snapfg_snapshot *s = e->snapshots[i];
    uint64_t first = offset >> s->chunk_shift;
    uint64_t last = (offset + count - 1) >> s->chunk_shift;

    int r;

    if (!snapshot_is_valid (s))
      continue;
    /* All the request's chunks together: one commit for all of them
     * (with held, left to the write-back committer).
     */
    r = snapshot_copy_out_range (s, first, last, held);
    if (r >= 0)
      continue;
    if (r == -ENOSPC) {
      snapshot_invalidate (s, "the COW store is full", 0);
      continue;
    }
    if (!snapshot_is_valid (s))
      continue;                 /* a COW error: the snapshot is gone */
    return r;                   /* origin read error, ENOMEM */
  }
  return 0;
}

/* Record the change in the active checkpoint before making it (its bit
 * reaches the bitmap file first: see cbt-bitmap.h); with FUA the bitmap
 * is synced too, before the origin is.
 */
static void
track_origin_change (struct snapfg_engine *e, uint32_t count,
                     uint64_t offset, unsigned flags)
{
  engine_track_change (e, offset, count);
  /* After the change's copy-outs: "changed NAME" of a snapshot that
   * wrote these chunks itself counts them again (snapshot-writes.h).
   */
  snapshot_writes_mark_origin (e, offset, count);
  if (flags & SNAPFG_REQ_FUA)
    checkpoint_sync (e);
}

/* Does [offset, offset+count) reach past the origin's current end (it
 * shrank under us)?  Then engine_origin_shrunk says so once and
 * invalidates every snapshot that lost data to it.
 */
static bool
origin_change_past_end (struct snapfg_engine *e, uint32_t count,
                        uint64_t offset)
{
  /* (It looks at the file's size only for an -EIO.) */
  return engine_origin_shrunk (e, -EIO, offset + count);
}

static int change_origin_in_order (struct snapfg_engine *e,
                                   enum origin_op op, const void *buf,
                                   uint32_t count, uint64_t offset,
                                   unsigned flags);

/* A first write under write-back: registered as held before its
 * copy-outs, which are left to the committer (their chunks claimed),
 * acknowledged at once.  An origin read error in one of those copies is
 * returned here if the committer met it before the acknowledgement;
 * after it, the write is dropped and the next flush fails (writeback.h).
 * Returns 0 (held), -EAGAIN (no room: the caller waits for it with no
 * lock held and tries again), or an error.  With no memory to hold it,
 * the change is made as writeback=off makes it.
 */
static int
hold_first_write (struct snapfg_engine *e, enum origin_op op,
                  const void *buf, uint32_t count, uint64_t offset,
                  unsigned flags)
{
  struct held_write *h;
  int r;

  /* Past the end of a shrunk origin the change would fail when the
   * committer applies it, after the client was told it succeeded: fail
   * it now, as writeback=off does.
   */
  if (origin_change_past_end (e, count, offset))
    return -EIO;
  h = writeback_hold_first (e, op, buf, count, offset, flags, &r);
  if (h == NULL)
    return r == 1 ? change_origin_in_order (e, op, buf, count, offset, flags)
      : r;
  r = prepare_origin_change (e, count, offset, h);
  if (r == 0) {
    track_origin_change (e, count, offset, flags);
    r = writeback_ready (e, h);
  }
  if (r < 0)
    writeback_cancel (e, h);
  return r;
}

/* Change the origin with every snapshot's copy durable first (the
 * commit waited for here), or, if it overlaps held writes, after them.
 */
static int
change_origin_in_order (struct snapfg_engine *e, enum origin_op op,
                        const void *buf, uint32_t count, uint64_t offset,
                        unsigned flags)
{
  int r = prepare_origin_change (e, count, offset, NULL);

  if (r < 0)
    return r;
  track_origin_change (e, count, offset, flags);
  /* Every chunk is remapped now (state D, which stays until the next
   * geometry change): a held write whose exception is not durable yet
   * is in the index before that exception was published, so it is
   * found here.
   */
  r = writeback_order_after_held (e, op, buf, count, offset, flags);
  if (r != 0)
    return r < 0 ? r : 0;
  return origin_apply_change (e, op, buf, count, offset, flags);
}

/* Write, zero or trim the origin.  A trimmed range reads back as zeroes
 * from a file, so it changes the origin's data too: every change waits
 * for the snapshots' copies first.
 */
static int
change_origin (struct snapfg_engine *e, enum origin_op op, const void *buf,
               uint32_t count, uint64_t offset, unsigned flags)
{
  bool fast = flags & SNAPFG_REQ_FAST_ZERO;
  uint64_t start = stats_now_ns ();
  percpu_rwlock_token token;
  int r;

  if (e->origin.readonly)
    return -EROFS;
 again:
  token = percpu_rwlock_read_lock (&e->geometry);
  if (suspend_holds_writes (&e->suspend)) {
    /* Suspended: wait for the resume with the read side let go, so that
     * a snapshot create (the write side) is not held up by us.
     */
    percpu_rwlock_read_unlock (&e->geometry, token);
    suspend_wait (e);
    goto again;
  }
  if (e->merging) {
    /* Unmerged chunks live in the COW store: zeroing them is not fast. */
    if (fast)
      r = -ENOTSUP;
    else {
      track_origin_change (e, count, offset, flags);
      r = merge_origin_io (e, op, (void *) buf, count, offset, flags);
    }
  }
  else {
    /* Write-back holds first writes whose copy-outs would wait for a
     * commit's syncs (copy-outs into stores that commit without waiting
     * are done at once, and the change goes to the origin: holding its
     * data would cost a copy and save nothing); FUA waits for its own
     * data on the origin, so it takes the path that does.
     */
    bool hold = writeback_active (e) && !fast && !(flags & SNAPFG_REQ_FUA) &&
      writeback_cost (op, count) <= writeback_max (e) &&
      needs_copy_out (e, count, offset, true);

    /* A fast zero must not copy out: refuse before changing anything. */
    if (fast && needs_copy_out (e, count, offset, false))
      r = -ENOTSUP;
    else if (hold) {
      r = hold_first_write (e, op, buf, count, offset, flags);
      if (r == -EAGAIN) {
        /* Full: wait for room with no lock held (the committer needs
         * none, but a geometry change waits for us), then look again.
         */
        percpu_rwlock_read_unlock (&e->geometry, token);
        writeback_wait_room (e, writeback_cost (op, count));
        goto again;
      }
    }
    else
      r = change_origin_in_order (e, op, buf, count, offset, flags);
  }
  percpu_rwlock_read_unlock (&e->geometry, token);
  stats_request (&e->stats, start, STAT_BYTES_WRITTEN, count, r);
  return r;
}

int
snapfg_origin_pwrite (struct snapfg_engine *e, const void *buf,
                      uint32_t count, uint64_t offset, unsigned flags)
{
  return change_origin (e, ORIGIN_WRITE, buf, count, offset, flags);
}

int
snapfg_origin_zero (struct snapfg_engine *e, uint32_t count, uint64_t offset,
                    unsigned flags)
{
  return change_origin (e, ORIGIN_ZERO, NULL, count, offset, flags);
}

int
snapfg_origin_trim (struct snapfg_engine *e, uint32_t count, uint64_t offset,
                    unsigned flags)
{
  return change_origin (e, ORIGIN_TRIM, NULL, count, offset, flags);
}

int
snapfg_origin_extents (struct snapfg_engine *e, uint32_t count,
                       uint64_t offset, unsigned flags,
                       snapfg_extent_fn fn, void *opaque)
{
  percpu_rwlock_token token = percpu_rwlock_read_lock (&e->geometry);
  /* During a merge, unmerged chunks live in the COW store: say data.
   * Held writes are data the device does not have yet.
   */
  int r = e->merging ? fn (opaque, offset, count, 0)
    : writeback_origin_extents (e, count, offset, fn, opaque);

  percpu_rwlock_read_unlock (&e->geometry, token);
  return r;
}

/* --- a replay of held writes after an unclean stop --- */

int
origin_replay_held (struct snapfg_engine *e)
{
  struct writeback_replayed w;
  uint64_t applied = 0, bytes = 0;
  uint32_t max;
  size_t n;
  void *buf = NULL;
  int r;

  r = writeback_replay_check (e, &n, &max);
  if (r < 0 || !writeback_replay_pending (e))
    return r;
  if (max && (buf = malloc (max)) == NULL)
    return -ENOMEM;
  /* In sequence order, through the path a client's request takes with
   * the committer not started: a chunk whose exception was committed
   * goes straight to the origin, one whose round was lost is copied out
   * again first (the origin still holds its old data).  A write applied
   * already before the stop is applied again: the same data, in the
   * same order, and no later write to its range can have reached the
   * origin (it stayed in the indexes until the file said it was
   * applied).
   */
  for (size_t i = 0; i < n && r == 0; ++i) {
    r = writeback_replay_get (e, i, &w, buf);
    if (r < 0 || w.dropped)
      continue;
    r = change_origin (e, w.op, buf, w.count, w.offset, w.flags);
    if (r < 0)
      snapfg_error ("origin=%s: replaying held write %" PRIu64 " (%s of %"
                    PRIu32 " bytes at %" PRIu64 ") failed: %s; the held "
                    "file is kept for the next start", e->origin.path,
                    w.seq, origin_op_name (w.op), w.count, w.offset,
                    strerror (-r));
    applied++;
    bytes += w.count;
  }
  free (buf);
  if (r == 0 && !e->origin.readonly) {
    r = device_flush (&e->origin);
    if (r < 0)
      snapfg_error ("origin=%s: flush after the replay of held writes "
                    "failed: %s; the held file is kept for the next start",
                    e->origin.path, strerror (-r));
  }
  if (r == 0)
    r = writeback_replay_finish (e, applied, bytes);
  return r;
}
