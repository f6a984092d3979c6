/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfgctl inspect: what a COW store on disk holds, without writing to
 * it (see snapfgctl(1)).
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <sys/sysmacros.h>

#include <jansson.h>

#include "device.h"
#include "dm-format.h"
#include "exception-table.h"
#include "store-binding.h"
#include "snapfgctl.h"

struct inspect_state {
  struct exception_table seen;    /* finds two pairs for one old chunk */
  bool print;
  json_t *pairs;                  /* --json --exceptions */
};

static int
inspect_pair (void *opaque, uint64_t old_chunk, uint64_t new_chunk)
{
  struct inspect_state *is = opaque;
  int r = exception_table_insert (&is->seen, old_chunk, new_chunk);

  if (r < 0)
    return r;
  if (is->pairs)
    json_array_append_new (is->pairs,
                           json_pack ("[II]", (json_int_t) old_chunk,
                                      (json_int_t) new_chunk));
  else if (is->print)
    printf ("%" PRIu64 " %" PRIu64 "\n", old_chunk, new_chunk);
  return 0;
}

/* The binding record snapfg keeps in the header chunk (store-binding.h):
 * printed, or (out != NULL) put in out as "merge_mark" and "binding".
 */
static void
print_binding (const struct snapfg_device *dev, const struct dm_header *h,
               json_t *out)
{
  unsigned char sector[512];
  struct store_binding b;

  if (out)
    json_object_set_new (out, "merge_mark", json_boolean (h->snapfg_merging));
  else if (h->snapfg_merging)
    printf ("merge mark: a merge into the origin is in progress\n");
  if (device_pread (dev, sector, sizeof sector, 0) < 0)
    return;
  if (binding_decode (sector + STORE_BINDING_OFFSET, &b) < 0) {
    if (out)
      json_object_set_new (out, "binding", json_string ("damaged"));
    else
      printf ("binding: damaged (checksum mismatch)\n");
    return;
  }
  if (!b.present) {
    if (out)
      json_object_set_new (out, "binding", json_null ());
    else
      printf ("binding: none (written by the kernel or an older snapfg)\n");
    return;
  }
  if (out) {
    json_t *jb = json_object ();
    if (jb == NULL)
      return;
    json_object_set_new (jb, "name", json_string (b.name));
    json_object_set_new (jb, "uuid", json_string (b.uuid));
    json_object_set_new (jb, "mode", json_string (binding_mode_name (b.mode)));
    json_object_set_new (jb, "state",
                         json_string (binding_state_name (b.state)));
    json_object_set_new (jb, "created", json_integer (b.created));
    json_object_set_new (jb, "origin_path", json_string (b.origin_path));
    json_object_set_new (jb, "origin_size",
                         json_integer ((json_int_t) b.origin_size));
    /* The origin's identity: a file's device and inode, a block
     * device's number in origin_ino (origin_dev 0); both 0: none.
     */
    json_object_set_new (jb, "origin_dev",
                         json_integer ((json_int_t) b.origin_dev));
    json_object_set_new (jb, "origin_ino",
                         json_integer ((json_int_t) b.origin_ino));
    json_object_set_new (jb, "catalogue",
                         b.catalogue_id[0] ? json_string (b.catalogue_id)
                         : json_null ());
    json_object_set_new (out, "binding", jb);
    return;
  }
  printf ("binding: snapshot %s, uuid %s, %s, state %s, created %" PRIi64
          "\n", b.name, b.uuid, binding_mode_name (b.mode),
          binding_state_name (b.state), b.created);
  printf ("binding origin: %s (%" PRIu64 " bytes)\n", b.origin_path,
          b.origin_size);
  if (b.origin_ino == 0)
    printf ("binding origin identity: none (matched by path and size)\n");
  else if (b.origin_dev == 0)
    printf ("binding origin identity: block device %u:%u\n",
            major (b.origin_ino), minor (b.origin_ino));
  else
    printf ("binding origin identity: device %" PRIu64 " inode %" PRIu64
            "\n", b.origin_dev, b.origin_ino);
  if (b.catalogue_id[0])
    printf ("binding catalogue: %s\n", b.catalogue_id);
}

static void
print_json (json_t *obj)
{
  char *s = json_dumps (obj, JSON_COMPACT);

  if (s)
    printf ("%s\n", s);
  free (s);
}

int
snapfgctl_inspect (const char *path, bool exceptions, bool json_output)
{
  struct inspect_state is = { .print = exceptions };
  struct snapfg_device dev;
  struct dm_header h;
  enum dm_header_kind kind;
  struct dm_load_result res;
  char why[256], status[96];
  uint32_t chunk_size;
  uint64_t sectors_per_chunk, total;
  json_t *out = NULL;
  int r;

  r = device_open (&dev, path, true);
  if (r == -EINVAL) {
    tool_error ("%s: not a regular file or block device",
                path);
    return EXIT_REFUSED;
  }
  if (r < 0) {
    tool_error ("%s: %s", path, strerror (-r));
    return EXIT_REFUSED;
  }
  r = dm_read_header (&dev, &h, &kind, why, sizeof why);
  if (r < 0) {
    tool_error ("%s: %s", path, why);
    device_close (&dev);
    return EXIT_REFUSED;
  }
  if (json_output) {
    out = json_pack ("{sssIsb}", "path", path, "size", (json_int_t) dev.size,
                     "empty", kind == DM_HEADER_EMPTY);
    if (out == NULL) {
      tool_error ("%s: out of memory (or the path is not "
                  "UTF-8)", path);
      device_close (&dev);
      return EXIT_REFUSED;
    }
  }
  else
    printf ("COW store: %s (%" PRIu64 " bytes)\n", path, dev.size);
  if (kind == DM_HEADER_EMPTY) {
    if (out)
      print_json (out);
    else
      printf ("empty: all zero, no header; a new snapshot would start here\n");
    json_decref (out);
    device_close (&dev);
    return EXIT_OK;
  }
  chunk_size = h.chunk_sectors * 512;
  sectors_per_chunk = h.chunk_sectors;
  total = dev.size / chunk_size * sectors_per_chunk;
  if (out)
    json_object_update_new (out, json_pack (
      "{sIsIsIsIsIsI}",
      "magic", (json_int_t) h.magic, "valid", (json_int_t) h.valid,
      "version", (json_int_t) h.version,
      "chunk_sectors", (json_int_t) h.chunk_sectors,
      "chunk_size", (json_int_t) chunk_size,
      "pairs_per_area", (json_int_t) dm_pairs_per_area (chunk_size),
      "total_sectors", (json_int_t) total));
  else {
    printf ("magic: 0x%08" PRIx32 " (SnAp)\n", h.magic);
    printf ("valid: %" PRIu32 "\n", h.valid);
    printf ("version: %" PRIu32 "\n", h.version);
    printf ("chunk size: %" PRIu32 " sectors (%" PRIu32 " bytes)\n",
            h.chunk_sectors, chunk_size);
    printf ("pairs per metadata area: %" PRIu64 "\n",
            dm_pairs_per_area (chunk_size));
  }
  print_binding (&dev, &h, out);
  if (h.valid == 0) {
    /* dm does not read the table of an Invalid snapshot either. */
    if (out) {
      json_object_set_new (out, "status", json_string ("Invalid"));
      print_json (out);
    }
    else
      printf ("status: Invalid\n");
    json_decref (out);
    device_close (&dev);
    return EXIT_OK;
  }

  if (exception_table_init (&is.seen, 8) < 0) {
    tool_error ("out of memory");
    json_decref (out);
    device_close (&dev);
    return EXIT_REFUSED;
  }
  if (out && exceptions)
    is.pairs = json_array ();
  else if (exceptions)
    printf ("exceptions (old_chunk new_chunk):\n");
  r = dm_load_exceptions (&dev, chunk_size, 0, inspect_pair, &is, &res,
                          why, sizeof why);
  exception_table_destroy (&is.seen);
  device_close (&dev);
  if (r < 0) {
    fflush (stdout);
    tool_error ("%s: corrupt store: %s", path, why);
    json_decref (is.pairs);
    json_decref (out);
    return EXIT_REFUSED;
  }
  /* As dmsetup status prints it, with the file's size as the total. */
  snprintf (status, sizeof status, "%" PRIu64 "/%" PRIu64 " %" PRIu64,
            res.next_free * sectors_per_chunk, total,
            (res.current_area + 2) * sectors_per_chunk);
  if (out) {
    json_object_update_new (out, json_pack (
      "{sIsIsIss}",
      "exceptions", (json_int_t) res.exceptions,
      "metadata_areas", (json_int_t) res.current_area + 1,
      "next_free_chunk", (json_int_t) res.next_free,
      "status", status));
    json_object_set_new (out, "allocated_bytes",
                         json_integer (res.next_free * chunk_size));
    json_object_set_new (out, "metadata_bytes",
                         json_integer ((res.current_area + 2) * chunk_size));
    json_object_set_new (out, "total_bytes", json_integer (total * 512));
    if (is.pairs)
      json_object_set_new (out, "pairs", is.pairs);
    print_json (out);
    json_decref (out);
    return EXIT_OK;
  }
  printf ("exceptions: %" PRIu64 "\n", res.exceptions);
  printf ("metadata areas: %" PRIu64 "\n", res.current_area + 1);
  printf ("next free chunk: %" PRIu64 "\n", res.next_free);
  printf ("status: %s\n", status);
  return EXIT_OK;
}
