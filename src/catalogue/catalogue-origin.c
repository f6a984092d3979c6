/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: which origin a catalogue belongs to (its "origin" object).
 *
 *   "origin": { "path": "...", "size": N, "dev": D, "ino": I }
 *
 * dev and ino are the origin's identity as the store bindings record it
 * (device.h): a regular file's device and inode numbers, a block
 * device's device number in ino (dev 0).  An NBD origin has none, and a
 * catalogue written before the identity was recorded has none either:
 * then the path (or URI) and the size decide, as they always did, and
 * the identity is added (written once the start has succeeded).
 *
 * With an identity on both sides it decides, as in the bindings: a file
 * renamed into the origin's place (same path, same size) is another
 * disk, and a catalogue that records snapshots is refused, saying what
 * changed (one that records none follows the new disk: its checkpoints
 * are judged by their bitmaps, which record the identity too, and are
 * found inconsistent); the origin itself renamed is still the origin
 * (the new path is recorded).
 * origin-moved=true says the origin really moved: an origin of the same
 * size is accepted whatever its path and identity, with a notice, and
 * the catalogue is rebound to it.  Another size is never the origin.
 *
 * A rebinding is only made in memory here (cat->pending):
 * catalogue_release writes it once the whole start has succeeded, so a
 * start that fails leaves the catalogue as it was.
 */

#include <config.h>

#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <sys/sysmacros.h>

#include <jansson.h>

#include "catalogue.h"
#include "catalogue-internal.h"
#include "snapfg-log.h"

json_t *
catalogue_origin_object (const struct catalogue_origin *origin)
{
  json_t *o = json_pack ("{s:s, s:I}", "path", origin->path,
                         "size", (json_int_t) origin->size);

  /* (Stored as signed 64-bit JSON integers; read back bit for bit.) */
  if (o && origin->has_identity &&
      (json_object_set_new (o, "dev", json_integer ((json_int_t)
                                                    origin->dev)) == -1 ||
       json_object_set_new (o, "ino", json_integer ((json_int_t)
                                                    origin->ino)) == -1)) {
    json_decref (o);
    o = NULL;
  }
  return o;
}

/* As the bindings say it: "device D inode I" or "block device M:m". */
static void
describe (uint64_t dev, uint64_t ino, char *out, size_t len)
{
  if (dev == 0)
    snprintf (out, len, "block device %u:%u", major (ino), minor (ino));
  else
    snprintf (out, len, "device %" PRIu64 " inode %" PRIu64, dev, ino);
}

/* Replace the document's origin object with the origin as it is now. */
static int
rebind (struct catalogue *cat, json_t *root,
        const struct catalogue_origin *origin, const char *event,
        const char *detail)
{
  json_t *o = catalogue_origin_object (origin);

  if (o == NULL || json_object_set_new (root, "origin", o) == -1)
    return -ENOMEM;
  if (event)
    catalogue_append_event (root, event, NULL, detail);
  cat->pending = true;          /* written by catalogue_release */
  return 0;
}

int
catalogue_check_origin (struct catalogue *cat, json_t *root,
                        const struct catalogue_origin *origin)
{
  json_t *o = json_object_get (root, "origin");
  json_t *jdev = json_object_get (o, "dev"), *jino = json_object_get (o, "ino");
  const char *path = json_string_value (json_object_get (o, "path"));
  uint64_t size = json_integer_value (json_object_get (o, "size"));
  bool recorded_id = jdev != NULL || jino != NULL;
  uint64_t dev = 0, ino = 0;
  bool same_path = strcmp (path, origin->path) == 0;
  char was[64] = "", now[64] = "", detail[1024];

  if (recorded_id) {
    if (!json_is_integer (jdev) || !json_is_integer (jino) ||
        json_integer_value (jino) == 0) {
      return snapfg_fail (EINVAL, "state=%s: malformed catalogue (the origin's \"dev\" "
                                  "and \"ino\" must both be integers, \"ino\" not 0); "
                                  "the file is left unchanged", cat->path);
    }
    dev = json_integer_value (jdev);
    ino = json_integer_value (jino);
    describe (dev, ino, was, sizeof was);
  }
  if (origin->has_identity)
    describe (origin->dev, origin->ino, now, sizeof now);

  if (size != origin->size) {
    return snapfg_fail (EINVAL, "state=%s: this catalogue belongs to origin %s (%" PRIu64
                                " bytes), not to origin=%s (%" PRIu64 " bytes); every "
                                "origin needs its own catalogue, and origin-moved=true "
                                "does not apply to an origin of another size (the file "
                                "is left unchanged)", cat->path, path, size,
                                origin->path, origin->size);
  }

  /* Both have an identity: it decides. */
  if (recorded_id && origin->has_identity) {
    if (dev == origin->dev && ino == origin->ino) {
      if (same_path)
        return 0;
      /* The origin itself, renamed or reached by another path. */
      snapfg_notice ("state=%s: the origin was recorded as %s; it is the "
                     "same disk (%s), now at %s: the catalogue records "
                     "the new path", cat->path, path, now, origin->path);
      snprintf (detail, sizeof detail, "%s -> %s", path, origin->path);
      return rebind (cat, root, origin, "origin-renamed", detail);
    }
    if (!origin->moved && same_path &&
        json_array_size (json_object_get (root, "snapshots")) == 0) {
      /* Nothing recorded was taken of the old disk but the checkpoints,
       * and each bitmap records the identity too: those are found
       * inconsistent (the next incremental asks for --full).  The
       * catalogue follows the disk that is there, so that a snapshot
       * taken of it now comes back at the next start.
       */
      snapfg_notice ("state=%s: the origin was replaced: the catalogue "
                     "recorded origin %s as %s, and it is %s now; no "
                     "snapshot is recorded, so the catalogue is rebound "
                     "to it (its checkpoints' bitmaps tracked the old "
                     "disk)", cat->path, path, was, now);
      snprintf (detail, sizeof detail, "%s -> %s", was, now);
      return rebind (cat, root, origin, "origin-replaced", detail);
    }
    if (!origin->moved) {
      if (same_path)
        return snapfg_fail (EINVAL, "state=%s: the origin was replaced: the catalogue "
                                    "recorded origin %s as %s, and %s is %s now (another "
                                    "file or device was put in its place); its snapshots "
                                    "were not taken of this disk.  Refusing to start (the "
                                    "catalogue is left unchanged); if the origin really "
                                    "moved (restored from a copy, its device "
                                    "renumbered), start with origin-moved=true",
                                    cat->path, path, was, origin->path, now);
      else
        return snapfg_fail (EINVAL, "state=%s: this catalogue belongs to origin %s (%s), "
                                    "not to origin=%s (%s); every origin needs its own "
                                    "catalogue (the file is left unchanged); if the "
                                    "origin really moved here, start with "
                                    "origin-moved=true", cat->path, path, was,
                                    origin->path, now);
    }
  }
  else if (same_path) {
    /* No identity to compare: the path (or URI) and the size, as
     * before; the identity is recorded from now on.
     */
    if (!origin->has_identity)
      return 0;
    return rebind (cat, root, origin, NULL, NULL);
  }
  else if (!origin->moved) {
    return snapfg_fail (EINVAL, "state=%s: this catalogue belongs to origin %s (%" PRIu64
                                " bytes), not to origin=%s (%" PRIu64 " bytes); every "
                                "origin needs its own catalogue (the file is left "
                                "unchanged); if the origin really moved here, start "
                                "with origin-moved=true", cat->path, path, size,
                                origin->path, origin->size);
  }

  /* origin-moved=true vouches for it: rebind. */
  if (!was[0])
    snprintf (was, sizeof was, "no identity recorded");
  if (!now[0])
    snprintf (now, sizeof now, "no identity");
  snapfg_notice ("state=%s: origin-moved=true: this catalogue was bound to "
                 "origin %s (%s); it is rebound to origin=%s (%s, the same "
                 "size: %" PRIu64 " bytes)", cat->path, path, was,
                 origin->path, now, origin->size);
  snprintf (detail, sizeof detail, "%s (%s) -> %s (%s)", path, was,
            origin->path, now);
  return rebind (cat, root, origin, "origin-moved", detail);
}
