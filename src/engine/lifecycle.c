/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: a snapshot's life beyond one server run (docs/design.md section 7):
 * the catalogue (state=) records every snapshot, drop and merge, and a
 * COW store is never this server's own export nor a file some snapshot
 * still holds.  These are the hooks that creating, dropping and merging
 * call; bringing the snapshots back at a restart, which creates them, is
 * above them in lifecycle-restore.c.
 *
 * The rule everything here serves: a snapshot is served as valid only if
 * every change to the origin since its instant went through a server
 * that held it.  The catalogue tells a restart which stores those are;
 * the stores' binding records (store-binding.c) refuse every other way
 * back in.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <time.h>
#include <unistd.h>

#include "engine-internal.h"
#include "lifecycle.h"
#include "catalogue.h"
#include "random-uuid.h"
#include "self-reference.h"
#include "snapfg-log.h"

void
snapfg_engine_set_catalogue (struct snapfg_engine *e, struct catalogue *cat)
{
  e->catalogue = cat;
}

int
lifecycle_record (struct snapfg_engine *e, struct snapfg_snapshot *s,
                  const struct snapfg_snapshot_options *o,
                  const char *store_type)
{
  struct catalogue_snapshot rec = {
    .name = s->name,
    .cow = s->store->dev.path,
    .store = (char *) store_type,
    .chunk_size = s->chunk_size,
    .cow_size = o->cow_size,
    .created = o->created ? o->created : (int64_t) time (NULL),
    .state = (char *) CATALOGUE_SNAPSHOT_ACTIVE,
    .owned = o->owned,
    .temporary = o->temporary,
  };

  if (e->catalogue == NULL || o->attach == SNAPFG_ATTACH_RESTORE)
    return 0;
  if (s->store->uuid[0])
    snprintf (rec.uuid, sizeof rec.uuid, "%s", s->store->uuid);
  else
    random_uuid (rec.uuid);  /* a transient store has no binding */
  return catalogue_snapshot_put (e->catalogue, &rec);
}

int
lifecycle_merging (struct snapfg_engine *e, struct snapfg_snapshot *s)
{
  if (e->catalogue == NULL)
    return 0;
  return catalogue_snapshot_set_state (e->catalogue, s->name,
                                       CATALOGUE_SNAPSHOT_MERGING);
}

int
lifecycle_unrecord_locked (struct snapfg_engine *e, struct snapfg_snapshot *s,
                           const char *event)
{
  int r;

  if (e->catalogue == NULL)
    return 0;
  /* The store file stays until lifecycle_forget: the catalogue must
   * stop naming it first, so that a restart never looks for a file that
   * is gone.
   */
  r = catalogue_snapshot_remove (e->catalogue, s->name, event,
                                 s->store->dev.path);
  if (r == -ENOENT)
    return 0;
  if (r < 0)
    snapfg_fail (-r, "%s %s: the catalogue %s cannot be rewritten (%s): "
                     "nothing was changed, the snapshot is still there; free "
                     "some space and try again", strcmp (event, "dropped") == 0
                     ? "drop" : "snapshot", s->name,
                     catalogue_path (e->catalogue), strerror (-r));
  else
    s->unrecorded = true;
  return r;
}

void
lifecycle_forget (struct snapfg_engine *e, struct snapfg_snapshot *s,
                  const char *event)
{
  struct snapfg_store *st = s->store;

  /* A dropped store can never be valid again: the origin moves on
   * without it.  (A merged one is empty: nothing to protect.)
   */
  if (strcmp (event, "dropped") == 0 && st->ops->mark_dropped)
    st->ops->mark_dropped (st);
  if (e->catalogue && !s->unrecorded) {
    int r = catalogue_snapshot_remove (e->catalogue, s->name, event,
                                       st->dev.path);
    if (r < 0 && r != -ENOENT) {
      snapfg_error ("snapshot %s: the catalogue %s still lists it; a "
                    "restart will find its store marked %s and finish "
                    "forgetting it", s->name,
                    catalogue_path (e->catalogue), event);
      return;                   /* its store stays: the record names it */
    }
  }
  /* A store in the state directory is the catalogue's own: it goes with
   * its snapshot (so that the name can be used again), once the
   * catalogue no longer names it.  Connections still holding it keep
   * their descriptor (and lock) until they close.
   */
  if (s->owned_cow && unlink (st->dev.path) == -1)
    snapfg_error ("snapshot %s: cannot remove its store %s: %m",
                  s->name, st->dev.path);
}

int
lifecycle_check_cow (struct snapfg_engine *e, const char *path, bool owned)
{
  char why[PATH_MAX + 128];
  const char *holder = NULL;
  int connections = 0;

  /* The catalogue's own files are rewritten and removed by the server:
   * a store there would be destroyed by the next catalogue change (or
   * would destroy it).  The one exception is the name the server picks
   * itself for a store in the state directory.
   */
  if (!owned && e->catalogue &&
      catalogue_names_own_file (e->catalogue, path, why, sizeof why)) {
    return snapfg_fail (EINVAL, "cow=%s: %s; the server writes that file itself, so it "
                                "cannot be a COW store: name another file", path, why);
  }

  if (device_is_uri (path) && self_reference_uri (path, why, sizeof why)) {
    return snapfg_fail (EINVAL, "cow=%s: %s; a COW store on this server's own exports "
                                "would write into the origin and deadlock on the first "
                                "origin write; use a file, or an export of another "
                                "server", path, why);
  }

  /* Dropped snapshots still referenced by connections keep their store
   * open (a transient one truncates its file when it finally closes):
   * their file is not free yet.
   */
  pthread_mutex_lock (&engine_live_lock);
  for (struct snapfg_snapshot *s = e->live; s; s = s->live_next)
    if (s->store && device_is_named (&s->store->dev, path)) {
      holder = s->name;
      connections = atomic_load (&s->stats.connections);
      break;
    }
  if (holder) {
    snapfg_fail (EBUSY, "cow=%s: still the COW store of snapshot \"%s\", dropped "
                        "but still used by %d connection%s; every snapshot needs "
                        "its own store: wait until they disconnect, or use "
                        "another file", path, holder, connections,
                        connections == 1 ? "" : "s");
  }
  pthread_mutex_unlock (&engine_live_lock);
  return holder ? -EBUSY : 0;
}
