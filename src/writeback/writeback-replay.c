/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg write-back: what a replay after an unclean stop needs of the
 * held file (writeback.h).  The writes themselves are made by the
 * engine's own request path (io-origin.c's origin_replay_held), which
 * calls these in order:
 *
 *   writeback_replay_check   the stores it is bound to are attached, and
 *                            every record's data passes its checksum:
 *                            nothing is written unless all is right
 *   writeback_replay_get     record i and its data, in sequence order
 *   writeback_replay_finish  the old file removed, a new one made, the
 *                            line in the log
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "writeback-internal.h"
#include "writeback.h"
#include "snapfg-log.h"

bool
writeback_replay_pending (const struct snapfg_engine *e)
{
  return e->wb && e->wb->replay_pending;
}

bool
writeback_replay_binds (const struct snapfg_engine *e, const char *uuid)
{
  struct writeback *wb = e->wb;

  if (wb == NULL || uuid == NULL || uuid[0] == '\0')
    return false;
  for (uint32_t i = 0; i < wb->replay_nstores; ++i)
    if (strcmp (wb->replay_stores[i], uuid) == 0)
      return true;
  return false;
}

void
writeback_replay_release_store (struct snapfg_engine *e, const char *uuid)
{
  struct writeback *wb = e->wb;

  if (wb == NULL || !wb->replay_pending || uuid == NULL || uuid[0] == '\0')
    return;
  for (uint32_t i = 0; i < wb->replay_nstores; ++i)
    if (strcmp (wb->replay_stores[i], uuid) == 0) {
      memmove (&wb->replay_stores[i], &wb->replay_stores[i + 1],
               (wb->replay_nstores - i - 1) * sizeof wb->replay_stores[i]);
      wb->replay_nstores--;
      return;
    }
}

/* Does the file hold a write that is to be applied? */
static bool
has_live_records (const struct writeback *wb)
{
  for (size_t i = 0; i < wb->replay.n; ++i)
    if (!wb->replay.r[i].dropped)
      return true;
  return false;
}

/* Is every store the file is bound to attached?  NULL, or the uuid of
 * one that is not.
 */
static const char *
missing_store (struct snapfg_engine *e)
{
  struct writeback *wb = e->wb;
  char (*now)[HELD_UUID_LEN];
  uint32_t n;
  const char *missing = NULL;

  if (writeback_bound_stores (e, &now, &n) < 0)
    return "(no memory to compare them)";
  for (uint32_t i = 0; i < wb->replay_nstores && !missing; ++i) {
    bool found = false;

    for (uint32_t j = 0; j < n && !found; ++j)
      found = strcmp (wb->replay_stores[i], now[j]) == 0;
    if (!found)
      missing = wb->replay_stores[i];
  }
  free (now);
  return missing;
}

int
writeback_replay_check (struct snapfg_engine *e, size_t *n,
                        uint32_t *max_count)
{
  struct writeback *wb = e->wb;
  const char *missing;
  void *buf = NULL;
  uint32_t max = 0;

  *n = 0;
  *max_count = 0;
  if (!writeback_replay_pending (e))
    return 0;
  /* Nothing to apply: the stores need no copy, whichever are here. */
  if (!has_live_records (wb))
    missing = NULL;
  else {
    SCOPED_GEOMETRY_READ_LOCK (&e->geometry);
    missing = missing_store (e);
  }
  if (missing) {
    snapfg_error ("held file %s: its %zu held writes were held for the "
                  "snapshot store with uuid %s, which is not attached: "
                  "start with the same snapshots (state=, cow=, snapshot=) "
                  "to replay them, or remove the file to start without them "
                  "(they are lost).  Nothing was written",
                  wb->file.path, wb->replay.n, missing);
    return -ENOENT;
  }
  for (size_t i = 0; i < wb->replay.n; ++i)
    if (wb->replay.r[i].count > max)
      max = wb->replay.r[i].count;
  if (max && (buf = malloc (max)) == NULL)
    return -ENOMEM;
  /* Every checksum before the first write: a damaged file is refused
   * whole, and never reaches the origin.
   */
  for (size_t i = 0; i < wb->replay.n; ++i) {
    const struct held_record *r = &wb->replay.r[i];

    if (r->dropped || r->op != HELD_OP_WRITE)
      continue;
    if (held_file_load_record (&wb->file, r, buf) < 0) {
      free (buf);
      return -EINVAL;
    }
  }
  free (buf);
  *max_count = max;
  *n = wb->replay.n;
  return 0;
}

int
writeback_replay_get (struct snapfg_engine *e, size_t i,
                      struct writeback_replayed *w, void *buf)
{
  struct writeback *wb = e->wb;
  const struct held_record *r = &wb->replay.r[i];

  w->seq = r->seq;
  w->op = r->op == HELD_OP_WRITE ? ORIGIN_WRITE
    : r->op == HELD_OP_ZERO ? ORIGIN_ZERO : ORIGIN_TRIM;
  w->offset = r->offset;
  w->count = r->count;
  w->flags = r->flags & HELD_FLAG_MAY_TRIM ? SNAPFG_REQ_MAY_TRIM : 0;
  w->dropped = r->dropped;
  if (r->dropped || r->op != HELD_OP_WRITE)
    return 0;
  return held_file_load_record (&wb->file, r, buf);
}

int
writeback_replay_finish (struct snapfg_engine *e, uint64_t applied,
                         uint64_t bytes)
{
  struct writeback *wb = e->wb;
  char (*stores)[HELD_UUID_LEN] = NULL;
  uint32_t n = 0;
  int r = 0;

  snapfg_notice ("origin=%s: replayed %" PRIu64 " held write%s (%" PRIu64
              " bytes) after an unclean stop, from %s",
              e->origin.path, applied, applied == 1 ? "" : "s", bytes,
              wb->file.path);
  if (wb->replay.torn)
    snapfg_notice ("origin=%s: the record of held write %" PRIu64 " was "
                "being written when the server stopped: that write was "
                "never acknowledged, and was not replayed",
                e->origin.path, wb->replay.torn_seq);
  held_file_close (&wb->file, true);
  free (wb->replay.r);
  wb->replay.r = NULL;
  wb->replay.n = 0;
  wb->replay_pending = false;
  if (!wb->enabled)
    return 0;
  {
    SCOPED_GEOMETRY_READ_LOCK (&e->geometry);
    r = writeback_bound_stores (e, &stores, &n);
  }
  if (r == 0)
    r = held_file_create (&wb->file, &wb->binding, stores, n);
  free (stores);
  if (r == 0)
    wb->file_ours = true;
  return r;
}
