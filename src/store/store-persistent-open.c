/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: opening a persistent store (see store-persistent.h): reading
 * or formatting the header, deciding from the binding record who may
 * attach it, and the unsynced mark of durability=flush.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>

#include "store-persistent.h"
#include "boot-id.h"
#include "rounding.h"
#include "snapfg-log.h"

/* Does this host's kernel own the cache that the store's unsynced
 * writes sit in?  A file or block device here is written through this
 * kernel's page cache, which outlives the process and is lost only with
 * the system (hence the boot id).  Anything else -- an NBD export -- has
 * its writes in another server's cache, which can be lost (that server
 * loses power or restarts) while this host keeps running, so the boot
 * id says nothing about it.  A disk with a local identity
 * (device_identity) is one of ours.
 */
static bool
cache_is_this_hosts (const struct snapfg_device *dev)
{
  struct device_identity id;

  return device_identity (dev, &id);
}

/* The header carries the unsynced mark: a server wrote the store with
 * durability=flush and did not close it cleanly.  If this is still the
 * boot it names and the store is a local disk, only that process died:
 * the page cache holds every write it made, in order, so the store is
 * whole.  Otherwise the system (or, for an NBD export, its server)
 * may have stopped while writes were not durable: the table may point
 * at data that never reached the disk, or miss chunks whose origin did.
 * Then the snapshot is Invalid, for good.
 */
static int
check_unsynced_mark (struct persistent_store *ps, const char *path,
                     struct dm_header *h)
{
  struct snapfg_store *st = &ps->base;
  char now[SNAPFG_BOOT_ID_MAX] = "";
  bool same_boot;

  if (h->valid != 0) {
    return snapfg_fail (EINVAL, "cow=%s: the header says valid = %" PRIu32 " and carries "
                                "snapfg's unsynced mark, which only a store with valid = 0 "
                                "can; refusing to use it (the file is left unchanged)",
                                path, h->valid);
  }
  same_boot = read_boot_id (now, sizeof now) == 0 &&
    strncmp (now, h->snapfg_unsynced_boot, SNAPFG_UNSYNCED_BOOT_LEN) == 0;
  if (same_boot && !cache_is_this_hosts (&st->dev)) {
    snapfg_error ("cow=%s: the server that wrote this store with "
                  "durability=flush stopped without closing it, and the "
                  "store is an NBD export whose cache this host does not "
                  "own (its server may have lost the writes that were not "
                  "flushed yet, whatever this host's boot id says), so its "
                  "table may not match its data: the snapshot is now "
                  "Invalid and its export fails every request (use "
                  "durability=sync for a COW store on an NBD export that "
                  "must survive that)", path);
    st->opened_invalid = true;
    ps->torn = true;            /* set_unsynced_mark drops the mark */
    return 0;
  }
  if (same_boot) {
    snapfg_debug ("cow=%s: the server that wrote this store with "
                  "durability=flush stopped without closing it, in this "
                  "boot: the store is whole", path);
    st->opened_invalid = false;
    h->valid = 1;               /* what it says once the mark is gone */
    ps->recovered = true;
    /* Until set_unsynced_mark has synced, any header written keeps the
     * mark (and valid = 0 on disk).
     */
    ps->marked = true;
    snprintf (ps->boot_id, sizeof ps->boot_id, "%s", h->snapfg_unsynced_boot);
    return 0;
  }
  snapfg_error ("cow=%s: the system stopped uncleanly (boot %s, now %s) "
                "while this store was written with durability=flush, so "
                "its table may not match its data: the snapshot is now "
                "Invalid and its export fails every request", path,
                h->snapfg_unsynced_boot, now[0] ? now : "unknown");
  st->opened_invalid = true;
  ps->torn = true;              /* set_unsynced_mark drops the mark */
  return 0;
}

/* At the end of opening (after the binding checks, which may refuse
 * the store without anything written): a store found unsynced from an
 * earlier boot becomes Invalid for good, without the mark, so that no
 * later boot id can match.  With durability=flush, mark the store
 * unsynced (this boot's id, valid = 0 on disk) before anything is
 * written without a sync.  Without it, a store found unsynced from a
 * process crash of this boot is made durable and unmarked first, since
 * commits will be synced from now on.
 */
static int
set_unsynced_mark (struct persistent_store *ps,
                   const struct snapfg_store_params *params)
{
  struct snapfg_store *st = &ps->base;
  int r;

  if (ps->torn && !st->dev.readonly) {
    ps->marked = false;
    ps->merging = false;
    r = persistent_write_header (ps, 0);
    if (r == 0)
      r = persistent_sync (ps);
    if (r < 0)
      snapfg_error ("cow=%s: could not write the Invalid header: %s",
                    params->path, strerror (-r));
    return 0;
  }
  if (st->opened_invalid || st->dev.readonly)
    return 0;
  if (params->unsynced) {
    if (read_boot_id (ps->boot_id, sizeof ps->boot_id) < 0) {
      return snapfg_fail (EINVAL, "cow=%s: durability=flush needs the kernel's boot id "
                                  "(/proc/sys/kernel/random/boot_id) to tell a process "
                                  "crash from a power loss, and it cannot be read "
                                  "(use durability=sync)", params->path);
    }
    ps->unsynced = true;
    ps->marked = true;
  }
  else if (ps->recovered)
    ps->marked = false;
  else
    return 0;
  /* Whatever an earlier process left in the page cache becomes durable
   * before the header changes.
   */
  r = persistent_sync (ps);
  if (r == 0)
    r = persistent_write_header (ps, 1);
  if (r == 0)
    r = persistent_sync (ps);
  if (r < 0)
    snapfg_fail (-r, "cow=%s: cannot write the header: %s",
                     params->path, strerror (-r));
  return r;
}

/* Read the binding record of an existing store and decide, for the
 * opener in params->bind, whether it may be attached; prepare the
 * record to write (*write_binding: an existing store's record changes).
 */
static int
check_binding (struct persistent_store *ps,
               const struct snapfg_store_params *params,
               const struct dm_header *h, enum dm_header_kind kind,
               bool *write_binding)
{
  const struct binding_want *want = params->bind;
  struct store_binding found = { 0 }, b;
  unsigned char sector[512], encoded[STORE_BINDING_SIZE];
  int r;

  if (kind == DM_HEADER_VALID) {
    r = device_pread (&ps->base.dev, sector, sizeof sector, 0);
    if (r < 0) {
      snapfg_fail (-r, "cow=%s: cannot read the header: %s", params->path,
                       strerror (-r));
      return r;
    }
    memcpy (ps->binding_raw, sector + STORE_BINDING_OFFSET,
            STORE_BINDING_SIZE);
    if (binding_decode (ps->binding_raw, &found) < 0) {
      return snapfg_fail (EINVAL, "cow=%s: the snapfg binding record in the header is "
                                  "damaged (checksum mismatch); refusing to use the "
                                  "store (the file is left unchanged; snapfgctl inspect "
                                  "shows the rest of it)", params->path);
    }
    if (found.present)
      snprintf (ps->base.uuid, sizeof ps->base.uuid, "%s", found.uuid);
  }
  if (want == NULL || want->request == BIND_NONE)
    return 0;

  if (kind == DM_HEADER_EMPTY) {
    if (want->request == BIND_RESTORE) {
      return snapfg_fail (EINVAL, "cow=%s: the catalogue's snapshot \"%s\" should be in "
                                  "this file, but it holds no store (empty or all "
                                  "zero); put the store back, or remove the snapshot's "
                                  "record from the catalogue", params->path, want->name);
    }
    binding_make (want, NULL, &b);
    binding_encode (&b, ps->binding_raw);
    snprintf (ps->base.uuid, sizeof ps->base.uuid, "%s", b.uuid);
    return 0;
  }

  r = binding_check (want, params->path, &found,
                     h->snapfg_merging && h->valid, h->valid != 0);
  if (r < 0 || h->valid == 0)
    return r;                   /* an Invalid store is not written to */
  binding_make (want, &found, &b);
  binding_encode (&b, encoded);
  if (memcmp (encoded, ps->binding_raw, STORE_BINDING_SIZE) != 0) {
    memcpy (ps->binding_raw, encoded, STORE_BINDING_SIZE);
    *write_binding = true;
  }
  snprintf (ps->base.uuid, sizeof ps->base.uuid, "%s", b.uuid);
  return 0;
}

/* Start a new store in an empty or all-zero COW device. */
static int
format_new_store (struct persistent_store *ps)
{
  struct snapfg_store *st = &ps->base;
  int r;

  /* Area 0 (and area 1, if the store has room for it) zero first, then
   * the header, then sync: a crash before the header is durable leaves
   * an all-zero (new) store.
   */
  r = persistent_zero_area (ps, 0);
  if (r == 0 && dm_area_chunk (1, ps->pairs_per_area) < st->max_chunks)
    r = persistent_zero_area (ps, 1);
  if (r == 0)
    r = persistent_sync (ps);
  if (r == 0)
    r = persistent_write_header (ps, 1);
  if (r == 0)
    r = persistent_sync (ps);
  if (r < 0) {
    snapfg_fail (-r, "cow=%s: cannot write a new store: %s",
                     st->dev.path, strerror (-r));
    return r;
  }
  ps->fresh = true;
  ps->current_area = 0;
  ps->area_used = 0;
  ps->zeroed_through =
    dm_area_chunk (1, ps->pairs_per_area) < st->max_chunks ? 1 : 0;
  atomic_store (&ps->metadata_areas, 1);
  atomic_store (&st->next_chunk, 2);
  return 0;
}

int
persistent_store_open (const struct snapfg_store_params *params,
                       struct snapfg_store **stp)
{
  struct persistent_store *ps;
  struct snapfg_store *st;
  struct dm_header h;
  enum dm_header_kind kind;
  uint64_t origin_chunks, areas;
  bool write_binding = false;
  char why[256];
  int r;

  ps = calloc (1, sizeof *ps);
  if (ps == NULL)
    return -ENOMEM;
  st = &ps->base;
  st->ops = &persistent_ops;
  st->origin_size = params->origin_size;
  /* durability=sync: each commit waits for two syncs. */
  st->commit_syncs = !params->unsynced;
  persistent_commit_init (ps);

  r = store_open_device (params, st);
  if (r < 0) {
    persistent_commit_destroy (ps);
    free (ps);
    return r;
  }
  if (!st->dev.can_flush) {
    /* Crash safety orders COW data, then metadata, then the origin by
     * flushing the store between them.
     */
    r = snapfg_fail (EINVAL, "cow=%s: the NBD server cannot flush, and a persistent "
                             "store needs flushes for crash safety (use store=transient "
                             "or a server that supports flush)", params->path);
    goto fail;
  }

  r = dm_read_header (&st->dev, &h, &kind, why, sizeof why);
  if (r < 0) {
    snapfg_fail (-r, "cow=%s: %s; refusing to use it (the file is left "
                     "unchanged)", params->path, why);
    goto fail;
  }

  /* The store's own chunk size wins over chunk-size=. */
  st->chunk_size = params->chunk_size;
  if (kind == DM_HEADER_VALID) {
    uint32_t stored = h.chunk_sectors * 512;
    if (stored != params->chunk_size)
      snapfg_debug ("cow=%s: the store's chunk size %" PRIu32 " overrides "
                    "chunk-size=%" PRIu32, params->path, stored,
                    params->chunk_size);
    st->chunk_size = stored;
    st->opened_invalid = h.valid == 0;
    if (h.snapfg_unsynced_boot[0]) {
      r = check_unsynced_mark (ps, params->path, &h);
      if (r < 0)
        goto fail;
    }
    st->opened_merging = ps->merging =
      h.snapfg_merging && !st->opened_invalid;
  }
  st->chunk_shift = log2_of_power_of_two (st->chunk_size);
  ps->pairs_per_area = dm_pairs_per_area (st->chunk_size);

  /* Who may attach this store (store-binding.c).  Refused: nothing is
   * written.
   */
  r = check_binding (ps, params, &h, kind, &write_binding);
  if (r < 0)
    goto fail;

  ps->area_buf = calloc (1, st->chunk_size);
  if (ps->area_buf == NULL) {
    r = -ENOMEM;
    goto fail;
  }

  /* Default size: the header, a copy of every origin chunk, the areas
   * describing them and the zeroed area after the last one.
   */
  origin_chunks = div_round_up (params->origin_size, st->chunk_size);
  areas = div_round_up (origin_chunks, ps->pairs_per_area);
  r = store_set_size (params, st,
                      (1 + origin_chunks + areas + 1) << st->chunk_shift);
  if (r < 0)
    goto fail;

  if (kind == DM_HEADER_EMPTY) {
    r = format_new_store (ps);
    if (r < 0)
      goto fail;
  }
  else if (st->opened_invalid && !ps->torn)
    snapfg_error ("cow=%s: the store is marked Invalid (valid = 0): the "
                  "snapshot's export fails every request", params->path);
  else
    ps->binding_pending = write_binding;

  r = set_unsynced_mark (ps, params);
  if (r < 0)
    goto fail;
  *stp = st;
  return 0;

 fail:
  /* One way out for every failure once the device is open: nothing of
   * the file changes unless we created it (then it goes).
   */
  persistent_commit_destroy (ps);
  free (ps->area_buf);
  store_discard_new (st);       /* frees ps, whose first member st is */
  return r;
}
