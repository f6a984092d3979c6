/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: a persistent store's binding record (see store-binding.h). */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <time.h>

#include "byte-order.h"
#include "store-binding.h"
#include "catalogue.h"
#include "snapfg-log.h"

#define BINDING_MAGIC "snapfgBR"
#define BINDING_VERSION 1

#define OFF_VERSION 8
#define OFF_MODE 12
#define OFF_STATE 16
#define OFF_CREATED 24
#define OFF_ORIGIN_SIZE 32
#define OFF_ORIGIN_DEV 40
#define OFF_ORIGIN_INO 48
#define OFF_ORIGIN_HASH 56
#define OFF_UUID 64
#define OFF_CATALOGUE 104
#define OFF_NAME 144
#define NAME_LEN 64
#define OFF_ORIGIN_PATH 208
#define ORIGIN_PATH_LEN 200
#define OFF_CRC 444

/* CRC-32 (IEEE, reflected), bit by bit: a few hundred bytes, rarely. */
static uint32_t
crc32_ieee (const unsigned char *p, size_t n)
{
  uint32_t crc = 0xffffffff;

  while (n--) {
    crc ^= *p++;
    for (int k = 0; k < 8; ++k)
      crc = (crc >> 1) ^ (0xedb88320 & -(crc & 1));
  }
  return ~crc;
}

static uint64_t
fnv1a64 (const char *s)
{
  uint64_t h = UINT64_C (0xcbf29ce484222325);

  while (*s) {
    h ^= (unsigned char) *s++;
    h *= UINT64_C (0x100000001b3);
  }
  return h;
}

static void
put_text (unsigned char *p, size_t len, const char *s)
{
  size_t n = strlen (s);

  memset (p, 0, len);
  memcpy (p, s, n < len ? n : len);
}

static void
get_text (const unsigned char *p, size_t len, char *out)
{
  memcpy (out, p, len);
  out[len] = '\0';
}

void
binding_encode (const struct store_binding *b,
                unsigned char out[STORE_BINDING_SIZE])
{
  memset (out, 0, STORE_BINDING_SIZE);
  memcpy (out, BINDING_MAGIC, 8);
  put_le32 (out + OFF_VERSION, BINDING_VERSION);
  put_le32 (out + OFF_MODE, b->mode);
  put_le32 (out + OFF_STATE, b->state);
  put_le64 (out + OFF_CREATED, b->created);
  put_le64 (out + OFF_ORIGIN_SIZE, b->origin_size);
  put_le64 (out + OFF_ORIGIN_DEV, b->origin_dev);
  put_le64 (out + OFF_ORIGIN_INO, b->origin_ino);
  put_le64 (out + OFF_ORIGIN_HASH, b->origin_hash);
  put_text (out + OFF_UUID, 36, b->uuid);
  put_text (out + OFF_CATALOGUE, 36, b->catalogue_id);
  put_text (out + OFF_NAME, NAME_LEN, b->name);
  put_text (out + OFF_ORIGIN_PATH, ORIGIN_PATH_LEN, b->origin_path);
  put_le32 (out + OFF_CRC, crc32_ieee (out, OFF_CRC));
}

int
binding_decode (const unsigned char in[STORE_BINDING_SIZE],
                struct store_binding *b)
{
  memset (b, 0, sizeof *b);
  if (memcmp (in, BINDING_MAGIC, 8) != 0)
    return 0;                   /* no record */
  if (get_le32 (in + OFF_CRC) != crc32_ieee (in, OFF_CRC) ||
      get_le32 (in + OFF_VERSION) != BINDING_VERSION)
    return -EINVAL;
  b->present = true;
  b->mode = get_le32 (in + OFF_MODE);
  b->state = get_le32 (in + OFF_STATE);
  b->created = get_le64 (in + OFF_CREATED);
  b->origin_size = get_le64 (in + OFF_ORIGIN_SIZE);
  b->origin_dev = get_le64 (in + OFF_ORIGIN_DEV);
  b->origin_ino = get_le64 (in + OFF_ORIGIN_INO);
  b->origin_hash = get_le64 (in + OFF_ORIGIN_HASH);
  get_text (in + OFF_UUID, 36, b->uuid);
  get_text (in + OFF_CATALOGUE, 36, b->catalogue_id);
  get_text (in + OFF_NAME, NAME_LEN, b->name);
  get_text (in + OFF_ORIGIN_PATH, ORIGIN_PATH_LEN, b->origin_path);
  return 0;
}

bool
binding_origin_matches (const struct store_binding *b,
                        const struct snapfg_device *origin)
{
  /* The same size, and the same path or the same file: a renamed origin
   * is still the origin, and so is one reached by another path to the
   * same inode.  A copy of it at another path is not: nothing says that
   * the copy and the store stayed together.
   */
  struct device_identity id;

  if (b->origin_size != origin->size)
    return false;
  if (b->origin_hash == fnv1a64 (origin->path))
    return true;
  /* (A block device is recorded with device 0 and its device number.) */
  return device_identity (origin, &id) && b->origin_ino != 0 &&
    b->origin_ino == id.ino && b->origin_dev == id.dev;
}

void
binding_make (const struct binding_want *want, const struct store_binding *old,
              struct store_binding *b)
{
  const struct snapfg_device *o = want->origin;
  struct device_identity id = { 0, 0 };   /* an NBD export has none */

  memset (b, 0, sizeof *b);
  b->present = true;
  b->state = BINDING_ATTACHED;
  if (want->catalogue_id)
    b->mode = BINDING_CATALOGUE;
  else if (want->request == BIND_RUNTIME)
    b->mode = BINDING_RUNTIME;
  else
    b->mode = BINDING_STARTUP;
  if (want->request == BIND_RESTORE && want->uuid)
    snprintf (b->uuid, sizeof b->uuid, "%s", want->uuid);
  else if (old && old->present)
    snprintf (b->uuid, sizeof b->uuid, "%s", old->uuid);
  else
    catalogue_uuid (b->uuid);
  b->created = old && old->present ? old->created : (int64_t) time (NULL);
  b->origin_size = o->size;
  device_identity (o, &id);
  b->origin_dev = id.dev;
  b->origin_ino = id.ino;
  b->origin_hash = fnv1a64 (o->path);
  snprintf (b->catalogue_id, sizeof b->catalogue_id, "%s",
            want->catalogue_id ? want->catalogue_id : "");
  snprintf (b->name, sizeof b->name, "%s", want->name ? want->name : "");
  snprintf (b->origin_path, sizeof b->origin_path, "%s", o->path);
}

const char *
binding_mode_name (uint32_t mode)
{
  switch (mode) {
  case BINDING_STARTUP: return "start-up";
  case BINDING_CATALOGUE: return "catalogue";
  case BINDING_RUNTIME: return "run-time";
  }
  return "unknown";
}

const char *
binding_state_name (uint32_t state)
{
  switch (state) {
  case BINDING_ATTACHED: return "attached";
  case BINDING_DROPPED: return "dropped";
  }
  return "unknown";
}

int
binding_check (const struct binding_want *want, const char *path,
               const struct store_binding *found, bool merge_marked,
               bool valid)
{
  const char *name = want->name;

  if (want->request == BIND_NONE)
    return 0;

  if (want->request == BIND_RUNTIME) {
    /* A snapshot taken now is the origin as it is now; a store that
     * already holds one is some other instant's, whatever it says.
     */
    snapfg_error ("cow=%s: already holds a snapshot store%s; a snapshot "
                  "created at run time needs a new, empty or all-zero COW "
                  "file (an existing store comes back only at start-up, "
                  "through state= or cow=/snapshot=); the file is left "
                  "unchanged", path,
                  merge_marked ? " with a merge in progress (the origin "
                  "is half merged: restart with this store to finish it)"
                  : found->present && found->state == BINDING_DROPPED
                  ? " whose snapshot was dropped" : "");
    return -EBUSY;
  }

  if (found->present && !binding_origin_matches (found, want->origin)) {
    snapfg_error ("cow=%s: this store belongs to another origin (%s, %"
                  PRIu64 " bytes), not to origin=%s; a snapshot store "
                  "only serves the origin it was taken of (the file is "
                  "left unchanged)", path, found->origin_path,
                  found->origin_size, want->origin->path);
    return -EINVAL;
  }

  if (found->present && found->state == BINDING_DROPPED) {
    if (want->request == BIND_RESTORE && want->uuid &&
        strcmp (found->uuid, want->uuid) == 0)
      return -ESTALE;           /* the drop was under way: finish it */
    snapfg_error ("cow=%s: snapshot \"%s\" in this store was dropped; the "
                  "origin has changed since, so it can never be a valid "
                  "snapshot again (delete the file, or use a new one); the "
                  "file is left unchanged", path, found->name);
    return -EINVAL;
  }

  if (want->request == BIND_RESTORE) {
    if (!found->present || found->mode != BINDING_CATALOGUE ||
        strcmp (found->uuid, want->uuid) != 0 ||
        strcmp (found->catalogue_id, want->catalogue_id) != 0) {
      snapfg_error ("cow=%s: not the store the catalogue recorded for "
                    "snapshot \"%s\" (uuid %s; the file holds %s%s); the "
                    "file is left unchanged: put the right store back, or "
                    "remove the snapshot's record from the catalogue",
                    path, name, want->uuid,
                    found->present ? "uuid " : "no snapfg binding",
                    found->present ? found->uuid : "");
      return -EINVAL;
    }
    /* The record and the store must agree on the name too: records
     * whose names were swapped would serve each other's data.
     */
    if (found->name[0] &&
        strncmp (found->name, name, sizeof found->name - 1) != 0) {
      snapfg_error ("cow=%s: the catalogue records this store as snapshot "
                    "\"%s\" (uuid %s), but the store holds snapshot \"%s\" "
                    "(uuid %s); refusing to serve it under another name (the "
                    "file is left unchanged): correct the catalogue record",
                    path, name, want->uuid, found->name, found->uuid);
      return -EINVAL;
    }
    if (merge_marked && !want->merge_expected) {
      snapfg_error ("cow=%s: snapshot \"%s\" carries a merge mark, but the "
                    "catalogue records no merge of it; refusing to guess "
                    "which view of the origin is right (the file is left "
                    "unchanged)", path, name);
      return -EINVAL;
    }
    return 0;
  }

  /* BIND_STARTUP: named on the command line. */
  if (found->present && found->mode == BINDING_RUNTIME && merge_marked &&
      want->catalogue_id == NULL) {
    /* A merge of a run-time snapshot was interrupted: the origin is half
     * merged, and only finishing the merge makes it whole again.
     */
    return 0;
  }
  if (found->present && found->mode == BINDING_RUNTIME) {
    snapfg_error ("cow=%s: snapshot \"%s\" in this store was created at "
                  "run time without state= and forgotten when its server "
                  "stopped; the origin may have changed since, so it "
                  "cannot be attached as a valid snapshot (use state= to "
                  "keep run-time snapshots across restarts; the file is "
                  "left unchanged)", path, found->name);
    return -EINVAL;
  }
  if (found->present && found->mode == BINDING_CATALOGUE) {
    if (want->catalogue_id == NULL) {
      snapfg_error ("cow=%s: snapshot \"%s\" in this store belongs to a "
                    "catalogue (id %s); only that catalogue can bring it "
                    "back: start with its state= file (the file is left "
                    "unchanged)", path, found->name, found->catalogue_id);
      return -EINVAL;
    }
    if (strcmp (found->catalogue_id, want->catalogue_id) != 0) {
      snapfg_error ("cow=%s: snapshot \"%s\" in this store belongs to "
                    "another catalogue (id %s, not %s); the file is left "
                    "unchanged", path, found->name, found->catalogue_id,
                    want->catalogue_id);
      return -EINVAL;
    }
    if (want->catalogue_knows == NULL ||
        !want->catalogue_knows (want->opaque, found->uuid)) {
      snapfg_error ("cow=%s: snapshot \"%s\" in this store was dropped "
                    "from or forgotten by the catalogue; the origin may "
                    "have changed since, so it cannot be attached as a "
                    "valid snapshot (the file is left unchanged)",
                    path, found->name);
      return -EINVAL;
    }
    return 0;
  }
  if (want->catalogue_id && merge_marked) {
    snapfg_error ("cow=%s: this store carries a merge in progress that "
                  "the catalogue does not know of; restart once without "
                  "state= to finish the merge (the file is left "
                  "unchanged)", path);
    return -EINVAL;
  }
  return 0;
}
