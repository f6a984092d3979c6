/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* Unit test of dm-snapshot's persistent format (src/store/dm-format.c),
 * without nbdkit: the header's and pairs' byte layout (little endian,
 * as the kernel writes it), snapfg's merge and unsynced marks, the area
 * geometry, and reading headers and exception tables from real files,
 * good and damaged.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <fcntl.h>

#include "device.h"
#include "dm-format.h"
#include "unit-test.h"

static void
test_header_layout (void)
{
  unsigned char buf[512];
  struct dm_header h = {
    .magic = DM_SNAP_MAGIC, .valid = 1, .version = DM_SNAP_VERSION,
    .chunk_sectors = 8,
  }, d;

  memset (buf, 0xee, sizeof buf);
  dm_header_encode (&h, buf);
  CHECK (memcmp (buf, "SnAp", 4) == 0);               /* 0x70416e53 LE */
  CHECK (buf[4] == 1 && buf[5] == 0 && buf[6] == 0 && buf[7] == 0);
  CHECK (buf[8] == 1 && buf[12] == 8 && buf[13] == 0);
  /* No marks: their bytes are zero; what follows is untouched. */
  for (int i = 16; i < 64; ++i)
    CHECK (buf[i] == 0);
  CHECK (buf[64] == 0xee);
  dm_header_decode (buf, &d);
  CHECK (d.magic == DM_SNAP_MAGIC && d.valid == 1 && d.version == 1 &&
         d.chunk_sectors == 8);
  CHECK (!d.snapfg_merging && d.snapfg_unsynced_boot[0] == '\0');

  /* The merge mark and the unsynced mark (cut to its 28 characters). */
  h.snapfg_merging = true;
  h.valid = 0;
  strcpy (h.snapfg_unsynced_boot, "0123456789abcdef0123456789ab");
  dm_header_encode (&h, buf);
  CHECK (memcmp (buf + 16, "snapfg:merging", 15) == 0);
  CHECK (memcmp (buf + 32, "SFGu0123", 8) == 0);
  dm_header_decode (buf, &d);
  CHECK (d.snapfg_merging && d.valid == 0);
  CHECK (strcmp (d.snapfg_unsynced_boot, "0123456789abcdef0123456789ab") == 0);

  /* A mark without an id matches no boot. */
  memset (buf + 36, 0, 28);
  dm_header_decode (buf, &d);
  CHECK (strcmp (d.snapfg_unsynced_boot, "?") == 0);
}

static void
test_pairs_and_geometry (void)
{
  unsigned char p[16];
  uint64_t o, n;

  dm_pair_encode (p, 0x0102030405060708, 0x1112131415161718);
  CHECK (p[0] == 0x08 && p[7] == 0x01 && p[8] == 0x18 && p[15] == 0x11);
  dm_pair_decode (p, &o, &n);
  CHECK (o == 0x0102030405060708 && n == 0x1112131415161718);

  /* 4 KiB chunks: 256 pairs per area; areas at 1, 258, 515, ... */
  CHECK (dm_pairs_per_area (4096) == 256);
  CHECK (dm_area_chunk (0, 256) == 1 && dm_area_chunk (1, 256) == 258);
  CHECK (dm_area_chunk (2, 256) == 515);
  CHECK (dm_is_metadata_chunk (0, 256) && dm_is_metadata_chunk (1, 256));
  CHECK (!dm_is_metadata_chunk (2, 256) && !dm_is_metadata_chunk (257, 256));
  CHECK (dm_is_metadata_chunk (258, 256));
  CHECK (dm_skip_metadata (0, 256) == 2 && dm_skip_metadata (258, 256) == 259);
  CHECK (dm_skip_metadata (100, 256) == 100);
}

/* --- files --- */

static char dir[] = "/tmp/test-dm-format.XXXXXX";
static char path[256];

/* A store file of 'chunks' chunks of 512 bytes (32 pairs per area). */
#define CS 512
#define PPA 32

static void
write_file (const void *buf, size_t len, size_t file_size)
{
  int fd = open (path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

  CHECK (fd >= 0);
  CHECK (ftruncate (fd, file_size) == 0);
  CHECK (pwrite (fd, buf, len, 0) == (ssize_t) len);
  close (fd);
}

static unsigned char *
new_store (size_t chunks)
{
  unsigned char *img = calloc (chunks, CS);
  struct dm_header h = {
    .magic = DM_SNAP_MAGIC, .valid = 1, .version = 1,
    .chunk_sectors = CS / 512,
  };

  CHECK (img != NULL);
  dm_header_encode (&h, img);
  return img;
}

static void
set_pair (unsigned char *img, uint64_t area, uint64_t i, uint64_t old_chunk,
          uint64_t new_chunk)
{
  dm_pair_encode (img + dm_area_chunk (area, PPA) * CS + i * 16,
                  old_chunk, new_chunk);
}

struct seen { uint64_t n; uint64_t last_old, last_new; unsigned char map[4096]; };

static int
collect (void *opaque, uint64_t old_chunk, uint64_t new_chunk)
{
  struct seen *s = opaque;

  if (old_chunk < sizeof s->map) {
    if (s->map[old_chunk])
      return -EEXIST;
    s->map[old_chunk] = 1;
  }
  s->n++;
  s->last_old = old_chunk;
  s->last_new = new_chunk;
  return 0;
}

/* Open path, read the header and load the table. */
static int
load (size_t origin_chunks, struct seen *s, struct dm_load_result *res,
      enum dm_header_kind *kind, char *why, size_t why_len)
{
  struct snapfg_device dev = { 0 };
  struct dm_header h;
  int r;

  memset (s, 0, sizeof *s);
  if (device_open (&dev, path, true) < 0)
    FAIL ("cannot open %s", path);
  r = dm_read_header (&dev, &h, kind, why, why_len);
  if (r == 0 && *kind == DM_HEADER_VALID)
    r = dm_load_exceptions (&dev, h.chunk_sectors * 512, origin_chunks,
                            collect, s, res, why, why_len);
  device_close (&dev);
  return r;
}

static void
test_files (void)
{
  struct dm_load_result res;
  enum dm_header_kind kind;
  struct seen s;
  char why[256];
  unsigned char *img, zero[4096] = { 0 };
  size_t chunks = 1 + 2 * (PPA + 1) + 1;

  CHECK (mkdtemp (dir) != NULL);
  snprintf (path, sizeof path, "%s/cow.img", dir);

  /* Empty and all-zero files are new stores; data without a header and
   * another magic are refused.
   */
  write_file (zero, 0, 0);
  CHECK (load (0, &s, &res, &kind, why, sizeof why) == 0 &&
         kind == DM_HEADER_EMPTY);
  write_file (zero, sizeof zero, 1 << 20);
  CHECK (load (0, &s, &res, &kind, why, sizeof why) == 0 &&
         kind == DM_HEADER_EMPTY);
  zero[4000] = 1;
  write_file (zero, sizeof zero, 8192);
  CHECK (load (0, &s, &res, &kind, why, sizeof why) == -EINVAL);
  CHECK (strstr (why, "not all zero") != NULL);
  write_file ("QCOW", 4, 8192);
  CHECK (load (0, &s, &res, &kind, why, sizeof why) == -EINVAL);
  CHECK (strstr (why, "magic") != NULL);

  /* A store with a full area 0 and two pairs in area 1. */
  img = new_store (chunks);
  for (uint64_t i = 0; i < PPA; ++i)
    set_pair (img, 0, i, 100 + i, 2 + i);
  set_pair (img, 1, 0, 7, dm_area_chunk (1, PPA) + 1);
  set_pair (img, 1, 1, 8, dm_area_chunk (1, PPA) + 2);
  write_file (img, chunks * CS, chunks * CS);
  CHECK (load (1000, &s, &res, &kind, why, sizeof why) == 0);
  CHECK (kind == DM_HEADER_VALID);
  CHECK (s.n == PPA + 2 && res.exceptions == PPA + 2);
  CHECK (res.current_area == 1 && res.area_used == 2);
  CHECK (res.next_free == dm_area_chunk (1, PPA) + 3);
  CHECK (s.last_old == 8);

  /* Damaged: a pair past the origin, at a metadata chunk, past the end
   * of the store, two pairs for one origin chunk; a bad chunk size, a
   * bad valid field, another version.
   */
  set_pair (img, 1, 1, 5000, dm_area_chunk (1, PPA) + 2);
  write_file (img, chunks * CS, chunks * CS);
  CHECK (load (1000, &s, &res, &kind, why, sizeof why) == -EINVAL);
  CHECK (strstr (why, "past the end of the origin") != NULL);
  set_pair (img, 1, 1, 8, dm_area_chunk (1, PPA));
  write_file (img, chunks * CS, chunks * CS);
  CHECK (load (1000, &s, &res, &kind, why, sizeof why) == -EINVAL);
  CHECK (strstr (why, "metadata chunk") != NULL);
  set_pair (img, 1, 1, 8, chunks + 5);
  write_file (img, chunks * CS, chunks * CS);
  CHECK (load (1000, &s, &res, &kind, why, sizeof why) == -EINVAL);
  CHECK (strstr (why, "past the end of the store") != NULL);
  set_pair (img, 1, 1, 7, dm_area_chunk (1, PPA) + 2);
  write_file (img, chunks * CS, chunks * CS);
  CHECK (load (1000, &s, &res, &kind, why, sizeof why) == -EINVAL);
  CHECK (strstr (why, "two pairs") != NULL);
  /* Two pairs sharing one COW chunk: in table order, and out of it
   * (the second pair's chunk is one area 0's first pair already uses).
   */
  set_pair (img, 1, 1, 8, dm_area_chunk (1, PPA) + 1);
  write_file (img, chunks * CS, chunks * CS);
  CHECK (load (1000, &s, &res, &kind, why, sizeof why) == -EINVAL);
  CHECK (strstr (why, "metadata area 1 pair 0 (origin chunk 7) and metadata "
                 "area 1 pair 1 (origin chunk 8) both keep their data in COW "
                 "chunk") != NULL);
  set_pair (img, 1, 1, 8, 2);
  write_file (img, chunks * CS, chunks * CS);
  CHECK (load (1000, &s, &res, &kind, why, sizeof why) == -EINVAL);
  CHECK (strstr (why, "metadata area 0 pair 0 (origin chunk 100) and metadata "
                 "area 1 pair 1 (origin chunk 8) both keep their data in COW "
                 "chunk 2") != NULL);
  set_pair (img, 1, 1, 8, dm_area_chunk (1, PPA) + 2);

  img[12] = 3;                                        /* 3 sectors */
  write_file (img, chunks * CS, chunks * CS);
  CHECK (load (1000, &s, &res, &kind, why, sizeof why) == -EINVAL);
  CHECK (strstr (why, "power of two") != NULL);
  img[12] = 1;
  img[4] = 2;                                         /* valid = 2 */
  write_file (img, chunks * CS, chunks * CS);
  CHECK (load (1000, &s, &res, &kind, why, sizeof why) == -EINVAL);
  img[4] = 1;
  img[8] = 2;                                         /* version 2 */
  write_file (img, chunks * CS, chunks * CS);
  CHECK (load (1000, &s, &res, &kind, why, sizeof why) == -EINVAL);
  CHECK (strstr (why, "version") != NULL);
  img[8] = 1;

  /* Truncated: area 1 is full too and area 2 lies past the end. */
  for (uint64_t i = 0; i < PPA; ++i)
    set_pair (img, 1, i, 200 + i, dm_area_chunk (1, PPA) + 1 + i);
  write_file (img, (chunks - 1) * CS, (chunks - 1) * CS);
  CHECK (load (1000, &s, &res, &kind, why, sizeof why) == -EINVAL);
  CHECK (strstr (why, "truncated") != NULL);

  free (img);
  unlink (path);
  rmdir (dir);
}

int
main (void)
{
  test_header_layout ();
  test_pairs_and_geometry ();
  test_files ();
  printf ("test-dm-format: ok\n");
  return 0;
}
