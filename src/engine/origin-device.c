/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the origin device under the request paths — applying a change
 * to it once every snapshot holds its copy (io-origin.c, merge.c and the
 * write-back committer call it), and noticing that the file shrank under
 * the server.  Below the copy-out and write-back, so that both can use it
 * without calling back up into the request paths.
 */

#include <config.h>

#include <string.h>
#include <errno.h>
#include <inttypes.h>

#include "engine-internal.h"
#include "engine-test-hooks.h"
#include "snapfg-log.h"

const char *
origin_op_name (enum origin_op op)
{
  switch (op) {
  case ORIGIN_READ: return "read";
  case ORIGIN_WRITE: return "write";
  case ORIGIN_ZERO: return "zero";
  case ORIGIN_TRIM: return "trim";
  }
  return "change";
}

/* Do a change to the origin once every snapshot holds its copy. */
int
origin_apply_change (struct snapfg_engine *e, enum origin_op op,
                     const void *buf, uint32_t count, uint64_t offset,
                     unsigned flags)
{
  bool fast = flags & SNAPFG_REQ_FAST_ZERO;
  int r = 0;

  switch (op) {
  case ORIGIN_WRITE:
    engine_fault_point (e, FAULT_BEFORE_ORIGIN_WRITE);
    r = device_pwrite (&e->origin, buf, count, offset);
    break;
  case ORIGIN_ZERO:
    r = device_zero (&e->origin, count, offset,
                     flags & SNAPFG_REQ_MAY_TRIM, fast);
    if (r == -EOPNOTSUPP && fast)
      return -ENOTSUP;          /* not an error: the client writes zeroes */
    break;
  case ORIGIN_TRIM:
    r = device_punch (&e->origin, count, offset);
    if (r == -EOPNOTSUPP)
      r = 0;                    /* trim is advisory */
    break;
  case ORIGIN_READ:
    return -EINVAL;
  }
  if (r == 0 && (flags & SNAPFG_REQ_FUA))
    r = device_flush (&e->origin);
  if (r < 0 && !engine_origin_shrunk (e, r, offset + count))
    snapfg_error ("origin=%s: %s of %" PRIu32 " bytes at %" PRIu64
                  " failed: %s", e->origin.path, origin_op_name (op),
                  count, offset, strerror (-r));
  return r;
}

/* Does s hold its own copy of every chunk of [first, last]? */
static bool
snapshot_holds_chunks (struct snapfg_snapshot *s, uint64_t first,
                       uint64_t last)
{
  for (uint64_t chunk = first; chunk <= last; ++chunk)
    if (!snapshot_chunk_is_remapped (s, chunk))
      return false;
  return true;
}

bool
engine_origin_shrunk (struct snapfg_engine *e, int r, uint64_t end)
{
  uint64_t now, seen;

  if (r != -EIO || device_current_size (&e->origin, &now) < 0 || now >= end)
    return false;               /* a real I/O error */
  seen = atomic_load (&e->origin_size_seen);
  while (now != seen)
    if (atomic_compare_exchange_weak (&e->origin_size_seen, &seen, now)) {
      snapfg_error ("origin=%s: the file shrank to %" PRIu64 " bytes "
                    "under the running server (it had %" PRIu64 " bytes "
                    "at start-up); requests past %" PRIu64 " fail with EIO",
                    e->origin.path, now, e->size, now);
      /* What was past the new end is gone: a snapshot that still read
       * any of it from the origin has lost that data for good (dm, too,
       * invalidates a snapshot whose copy fails).
       */
      for (size_t i = 0; i < e->nsnapshots; ++i) {
        struct snapfg_snapshot *s = e->snapshots[i];

        if (snapshot_is_valid (s) &&
            !snapshot_holds_chunks (s, now >> s->chunk_shift,
                                    (e->size - 1) >> s->chunk_shift))
          snapshot_invalidate (s, "the origin shrank, and the data it "
                               "lost was not copied out", 0);
      }
      break;
    }
  return true;
}
