/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: bringing the catalogue's snapshots back at a start
 * (docs/design.md section 7).
 *
 * Above snapshot creation: each record is created again through
 * snapfg_snapshot_create (which checks its store's binding and calls
 * the lifecycle hooks of lifecycle.c), records whose store says it was
 * dropped are finished, and an interrupted merge is marked again.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>

#include "engine-internal.h"
#include "merge.h"
#include "catalogue.h"
#include "scoped-lock.h"
#include "snapfg-log.h"
#include "snapfg-error.h"

/* A catalogue record whose store says it was dropped: the server died
 * between marking the store and telling the catalogue.  Finish it.
 */
static int
finish_forgetting (struct snapfg_engine *e,
                   const struct catalogue_snapshot *rec, const char *event,
                   const char *detail)
{
  /* The catalogue is held during the start: the file goes once the
   * catalogue that forgets it is written (catalogue_release).  Only a
   * store the record says the server made, which the catalogue has
   * checked is the state directory's file of that name, is removed.
   */
  return catalogue_snapshot_forget (e->catalogue, rec->name, event, detail,
                                    rec->owned ? rec->cow : NULL);
}

int
snapfg_engine_restore (struct snapfg_engine *e)
{
  struct catalogue_snapshot *list;
  size_t n;
  int r;

  if (e->catalogue == NULL)
    return 0;
  r = catalogue_snapshots (e->catalogue, &list, &n);
  if (r < 0)
    return r;

  for (size_t i = 0; i < n && r == 0; ++i) {
    const struct catalogue_snapshot *rec = &list[i];
    struct snapfg_snapshot_options o = {
      .name = rec->name,
      .cow_path = rec->cow,
      .store_type = rec->store,
      .chunk_size = rec->chunk_size,
      .cow_size = rec->cow_size,
      .attach = SNAPFG_ATTACH_RESTORE,
      .uuid = rec->uuid,
      .merging = strcmp (rec->state, CATALOGUE_SNAPSHOT_MERGING) == 0,
      .owned = rec->owned,
      .created = rec->created,
    };
    const struct store_type *type = store_type_find (rec->store);
    struct snapfg_snapshot *s;

    /* A snapshot made for one run of a tool (snapfg-backup's) served
     * that run only: the run died with the server, and brought back the
     * snapshot would only cost a copy-out on every first write until
     * the tool's next run dropped it.  As a transient one, it is gone;
     * a merge, once started, is finished instead.
     */
    if (rec->temporary && !o.merging) {
      snapfg_debug ("state=%s: temporary snapshot %s (made for one run) "
                    "dropped at the restart", catalogue_path (e->catalogue),
                    rec->name);
      r = finish_forgetting (e, rec, "dropped",
                             "temporary: made for one run, which ended "
                             "with the server");
      /* Writes held before the stop need no copy in it any more. */
      writeback_replay_release_store (e, rec->uuid);
      continue;
    }
    /* (The catalogue has checked that the type exists.) */
    if (type && !type->survives_restart) {
      /* A transient table lived in memory only. */
      snapfg_debug ("state=%s: transient snapshot %s did not survive the "
                    "restart: recorded as lost",
                    catalogue_path (e->catalogue), rec->name);
      r = finish_forgetting (e, rec, "lost",
                             "transient: its exceptions were in memory "
                             "only");
      continue;
    }

    snapfg_clear_error ();
    r = snapfg_snapshot_create (e, &o);
    if (r == -ESTALE) {
      snapfg_debug ("state=%s: snapshot %s was being dropped: done",
                    catalogue_path (e->catalogue), rec->name);
      r = finish_forgetting (e, rec, "dropped", "finished at restart");
      continue;
    }
    if (r < 0) {
      /* Why, from the record create left (only recorded if it was a
       * refusal: said here, once, with what to do).
       */
      const char *why = snapfg_get_error ();

      if (why && !snapfg_error_logged ())
        snapfg_fail_logged (-r, "state=%s: cannot bring back snapshot "
                            "\"%s\" (COW %s): %s; fix the store, or remove "
                            "the snapshot's record from the catalogue",
                            catalogue_path (e->catalogue), rec->name,
                            rec->cow, why);
      else
        snapfg_error ("state=%s: cannot bring back snapshot \"%s\" (COW "
                      "%s); see the error above: fix the store, or remove "
                      "the snapshot's record from the catalogue",
                      catalogue_path (e->catalogue), rec->name, rec->cow);
      break;
    }

    /* The catalogue says merging but the store is not marked: the
     * server died between the two.  Start the merge now (its thread
     * starts with snapfg_engine_start_background, before any client).
     */
    s = snapfg_snapshot_get (e, rec->name);
    if (s && o.merging && atomic_load (&s->state) != SNAPSHOT_MERGING) {
      const char *problem;

      {
        SCOPED_GEOMETRY_WRITE_LOCK (&e->geometry);
        problem = merge_prepare_locked (e, s, &r);
      }
      if (problem) {
        snapfg_error ("state=%s: cannot resume the merge of snapshot "
                      "\"%s\": %s", catalogue_path (e->catalogue),
                      rec->name, problem);
        r = -EINVAL;
      }
    }
    snapfg_snapshot_put (s);
  }
  catalogue_snapshots_free (list, n);
  /* Every recorded snapshot is back: what the start changed in the
   * catalogue (checkpoints found inconsistent, snapshots finished
   * forgetting) is written now, and not at all if the start failed.
   */
  if (r == 0)
    r = catalogue_release (e->catalogue);
  return r;
}
