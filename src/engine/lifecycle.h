/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: a snapshot's life beyond one run (lifecycle.c): the
 * catalogue's records of the engine's snapshots.
 */
#ifndef SNAPFG_LIFECYCLE_H
#define SNAPFG_LIFECYCLE_H

#include <stdbool.h>

#include "engine-internal.h"

/* lifecycle.c: the snapshot s has left the engine's list ("dropped" or
 * "merged"): mark its store, tell the catalogue, remove a COW file of
 * the state directory.
 */
extern void lifecycle_forget (struct snapfg_engine *e,
                              struct snapfg_snapshot *s, const char *event);
/* lifecycle.c: before s leaves the list, the catalogue (if any) stops
 * listing it ("dropped"), durably; on failure (e.g. -ENOSPC) it says so
 * and nothing has changed.  Called with the geometry write side held.
 */
extern int lifecycle_unrecord_locked (struct snapfg_engine *e,
                                      struct snapfg_snapshot *s,
                                      const char *event);
/* lifecycle.c: record a new snapshot in the catalogue (if any); called
 * with the geometry write side held, just before it is published.
 */
extern int lifecycle_record (struct snapfg_engine *e,
                             struct snapfg_snapshot *s,
                             const struct snapfg_snapshot_options *o,
                             const char *store_type);
/* lifecycle.c: the catalogue (if any) records that s is being merged. */
extern int lifecycle_merging (struct snapfg_engine *e,
                              struct snapfg_snapshot *s);
/* lifecycle.c: may path become a new COW store?  Refuses (saying why)
 * this server's own sockets, files still held by any snapshot, dropped
 * ones included, and (unless owned: the server picked the name in the
 * state directory) the files of the catalogue.
 */
extern int lifecycle_check_cow (struct snapfg_engine *e, const char *path,
                                bool owned);
#endif
