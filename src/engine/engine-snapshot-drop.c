/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: dropping a snapshot.  Above the snapshot's own file
 * (engine-snapshot.c), the write-back committer and the lifecycle it
 * tells, so that none of them has to call back up into the drop.
 */

#include <config.h>

#include <string.h>
#include <errno.h>

#include "engine-internal.h"
#include "lifecycle.h"
#include "scoped-lock.h"
#include "snapfg-log.h"

int
snapfg_snapshot_drop (struct snapfg_engine *e, const char *name)
{
  struct snapfg_snapshot *s = NULL;
  bool merging = false;
  int r;

  /* The write side: requests in flight on any view finish first, and no
   * origin write is between its copy-outs and its data write.
   */
  {
    SCOPED_GEOMETRY_WRITE_LOCK (&e->geometry);
    size_t i;

    /* The committer may still hold exceptions of this snapshot to
     * commit: let it finish with them before the store goes.
     */
    writeback_drain (e);

    for (i = 0; i < e->nsnapshots; ++i) {
      if (strcmp (e->snapshots[i]->name, name) == 0) {
        s = e->snapshots[i];
        break;
      }
    }
    merging = s && s == e->merging;
    /* The catalogue forgets it first: if that cannot be written (a full
     * file system), the drop fails and nothing changes.
     */
    if (s && !merging && (r = lifecycle_unrecord_locked (e, s, "dropped")) < 0)
      return r;
    if (s && !merging) {
      memmove (&e->snapshots[i], &e->snapshots[i + 1],
               (e->nsnapshots - i - 1) * sizeof *e->snapshots);
      e->nsnapshots--;
      e->min_chunk_size = engine_min_chunk_size (e);
      atomic_store (&s->state, SNAPSHOT_DROPPED);
      /* Nothing is held (drained above): the held file names the stores
       * left.
       */
      writeback_bind_stores (e);
    }
  }

  if (merging) {
    return snapfg_fail (EBUSY, "drop: snapshot \"%s\" is being merged into the origin",
                               name);
  }
  if (s == NULL) {
    return snapfg_fail (ENOENT, "drop: no snapshot named \"%s\"", name);
  }
  snapfg_debug ("snapshot %s dropped (COW %s)", s->name, s->store->dev.path);
  lifecycle_forget (e, s, "dropped");
  snapfg_snapshot_put (s);      /* the list's reference */
  return 0;
}
