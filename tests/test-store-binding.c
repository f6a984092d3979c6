/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* Unit test of the store binding (src/store/store-binding.c), without
 * nbdkit:
 *
 *  - the record's encoding: round trip, little-endian layout, a damaged
 *    CRC or version refused, no magic = no record;
 *  - the decision table (binding_decide) against the decision tree it
 *    replaced, written out here again, for every request and every
 *    combination of facts;
 *  - the facts about the origin for real files: the same file, renamed,
 *    replaced by rename (same path and size), another size, a record
 *    without identity, and origin-moved;
 *  - binding_check's return codes.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/stat.h>

#include "device.h"
#include "store-binding.h"
#include "snapfg-log.h"
#include "unit-test.h"

/* The decision tree binding_check was before it became a table (with
 * the name check of a catalogue's snapshot added since).
 */
static struct binding_decision
reference (enum binding_request rq, unsigned f)
{
#define D(v, r) return (struct binding_decision) { v, r }
  bool present = f & BF_PRESENT;

  if (rq == BIND_NONE)
    D (BV_ATTACH, BR_OK);
  if (rq == BIND_RUNTIME)
    D (BV_BUSY, BR_NOT_NEW);
  if (present && (f & BF_OTHER_ORIGIN))
    D (BV_REFUSE, BR_OTHER_ORIGIN);
  if (present && (f & BF_DROPPED)) {
    if (rq == BIND_RESTORE && (f & BF_SAME_UUID))
      D (BV_FINISH_DROP, BR_DROP_UNDER_WAY);
    D (BV_REFUSE, BR_DROPPED);
  }
  if (rq == BIND_RESTORE) {
    if (!present || !(f & BF_MODE_CATALOGUE) || !(f & BF_SAME_UUID) ||
        !(f & BF_SAME_CATALOGUE))
      D (BV_REFUSE, BR_NOT_RECORDED_STORE);
    if ((f & BF_MERGE_MARK) && !(f & BF_MERGE_EXPECTED))
      D (BV_REFUSE, BR_UNKNOWN_MERGE);
    if (f & BF_OTHER_NAME)
      D (BV_REFUSE, BR_OTHER_NAME);
    D (BV_ATTACH, BR_OK);
  }
  if (present && (f & BF_MODE_RUNTIME) && (f & BF_MERGE_MARK) &&
      !(f & BF_HAVE_CATALOGUE))
    D (BV_ATTACH, BR_MERGE_TO_FINISH);
  if (present && (f & BF_MODE_RUNTIME))
    D (BV_REFUSE, BR_FORGOTTEN_RUNTIME);
  if (present && (f & BF_MODE_CATALOGUE)) {
    if (!(f & BF_HAVE_CATALOGUE))
      D (BV_REFUSE, BR_NEEDS_CATALOGUE);
    if (!(f & BF_SAME_CATALOGUE))
      D (BV_REFUSE, BR_OTHER_CATALOGUE);
    if (!(f & BF_KNOWN))
      D (BV_REFUSE, BR_NOT_IN_CATALOGUE);
    D (BV_ATTACH, BR_OK);
  }
  if ((f & BF_HAVE_CATALOGUE) && (f & BF_MERGE_MARK))
    D (BV_REFUSE, BR_MERGE_WITHOUT_CATALOGUE);
  D (BV_ATTACH, BR_OK);
#undef D
}

static void
test_table (void)
{
  unsigned seen = 0;

  for (int rq = BIND_NONE; rq <= BIND_RESTORE; ++rq)
    for (unsigned g = 0; g < (1u << 12); ++g) {
      /* Bits 0..10, and bit 11 of g stands for BF_OTHER_NAME (bit 12;
       * bit 11 is the informational BF_ORIGIN_REBOUND, checked below).
       */
      unsigned f = (g & 0x7ff) | (g & 0x800 ? BF_OTHER_NAME : 0);

      /* A record has one mode: runtime and catalogue together is not a
       * state a record can be in.
       */
      if ((f & BF_MODE_RUNTIME) && (f & BF_MODE_CATALOGUE))
        continue;
      struct binding_decision got = binding_decide (rq, f);
      struct binding_decision want = reference (rq, f);
      if (got.verdict != want.verdict || got.reason != want.reason)
        FAIL ("binding_decide (request %d, facts 0x%x) = (%d, %d), the "
              "decision tree says (%d, %d)", rq, f, got.verdict,
              got.reason, want.verdict, want.reason);
      seen |= 1u << got.reason;
      /* The safety rules, whatever the rest. */
      if ((f & BF_PRESENT) && (f & BF_OTHER_ORIGIN) && rq != BIND_NONE)
        CHECK (got.verdict != BV_ATTACH);
      if (rq == BIND_RUNTIME)
        CHECK (got.verdict == BV_BUSY);
      /* The informational bit never changes a decision. */
      struct binding_decision moved = binding_decide (rq,
                                                      f | BF_ORIGIN_REBOUND);
      CHECK (moved.verdict == got.verdict && moved.reason == got.reason);
    }
  /* Every reason is reachable. */
  CHECK (seen == (1u << (BR_OTHER_NAME + 1)) - 1);
}

static void
test_encoding (void)
{
  struct store_binding b = {
    .present = true, .mode = BINDING_CATALOGUE, .state = BINDING_DROPPED,
    .created = 1796159458, .origin_size = 0x123456789a,
    .origin_dev = 64768, .origin_ino = 1835011, .origin_hash = 42,
  }, d;
  unsigned char raw[STORE_BINDING_SIZE];

  strcpy (b.uuid, "c7850000-1111-4222-8333-444455556666");
  strcpy (b.catalogue_id, "dc370000-1111-4222-8333-444455556666");
  strcpy (b.name, "nightly");
  strcpy (b.origin_path, "/var/lib/vm/disk.img");
  binding_encode (&b, raw);
  CHECK (memcmp (raw, "snapfgBR", 8) == 0);
  CHECK (raw[8] == 1 && raw[9] == 0);                 /* version 1, LE */
  CHECK (raw[12] == BINDING_CATALOGUE && raw[16] == BINDING_DROPPED);
  CHECK (raw[32] == 0x9a && raw[33] == 0x78 && raw[36] == 0x12);
  CHECK (raw[40] == (64768 & 0xff) && raw[41] == (64768 >> 8));
  CHECK (memcmp (raw + 144, "nightly", 8) == 0);
  CHECK (binding_decode (raw, &d) == 0 && d.present);
  CHECK (d.mode == b.mode && d.state == b.state && d.created == b.created);
  CHECK (d.origin_size == b.origin_size && d.origin_dev == b.origin_dev &&
         d.origin_ino == b.origin_ino && d.origin_hash == b.origin_hash);
  CHECK (strcmp (d.uuid, b.uuid) == 0 && strcmp (d.name, b.name) == 0);
  CHECK (strcmp (d.catalogue_id, b.catalogue_id) == 0);
  CHECK (strcmp (d.origin_path, b.origin_path) == 0);

  /* Any damaged byte before the CRC is seen. */
  for (size_t i = 8; i < 444; i += 37) {
    raw[i] ^= 0x10;
    CHECK (binding_decode (raw, &d) == -EINVAL);
    raw[i] ^= 0x10;
  }
  CHECK (binding_decode (raw, &d) == 0);
  raw[0] = 'S';                                       /* no magic */
  CHECK (binding_decode (raw, &d) == 0 && !d.present);
  memset (raw, 0, sizeof raw);                        /* the kernel's */
  CHECK (binding_decode (raw, &d) == 0 && !d.present);
}

static char dir[] = "/tmp/test-store-binding.XXXXXX";

static void
make_file (const char *path, size_t size)
{
  int fd = open (path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

  CHECK (fd >= 0);
  CHECK (ftruncate (fd, size) == 0);
  close (fd);
}

static void
open_dev (struct snapfg_device *d, const char *path)
{
  memset (d, 0, sizeof *d);
  if (device_open (d, path, true) < 0)
    FAIL ("cannot open %s", path);
}

static void
test_origin_facts (void)
{
  char origin[256], other[256], renamed[256], what[256];
  struct snapfg_device dev;
  struct store_binding b;
  struct binding_want want = { .request = BIND_STARTUP, .name = "s" };
  unsigned f;

  CHECK (mkdtemp (dir) != NULL);
  snprintf (origin, sizeof origin, "%s/origin.img", dir);
  snprintf (other, sizeof other, "%s/other.img", dir);
  snprintf (renamed, sizeof renamed, "%s/renamed.img", dir);
  make_file (origin, 1 << 20);

  /* The record as a start on origin writes it. */
  open_dev (&dev, origin);
  want.origin = &dev;
  binding_make (&want, NULL, &b);
  CHECK (b.origin_ino != 0);
  CHECK (binding_origin_compare (&b, &dev, what, sizeof what)
         == BINDING_ORIGIN_SAME);
  f = binding_facts (&want, &b, false, what, sizeof what);
  CHECK ((f & BF_PRESENT) && !(f & BF_OTHER_ORIGIN));
  CHECK (binding_check (&want, "x.cow", &b, false, true) == 0);
  device_close (&dev);

  /* Renamed: the same file under another path. */
  CHECK (rename (origin, renamed) == 0);
  open_dev (&dev, renamed);
  CHECK (binding_origin_compare (&b, &dev, what, sizeof what)
         == BINDING_ORIGIN_SAME);
  device_close (&dev);
  CHECK (rename (renamed, origin) == 0);

  /* Replaced: another file renamed into its place. */
  make_file (other, 1 << 20);
  CHECK (rename (other, origin) == 0);
  open_dev (&dev, origin);
  want.origin = &dev;
  CHECK (binding_origin_compare (&b, &dev, what, sizeof what)
         == BINDING_ORIGIN_REPLACED);
  CHECK (strstr (what, "inode") != NULL);
  f = binding_facts (&want, &b, false, what, sizeof what);
  CHECK (f & BF_OTHER_ORIGIN);
  CHECK (binding_check (&want, "x.cow", &b, false, true) == -EINVAL);
  want.request = BIND_RESTORE;
  CHECK (binding_check (&want, "x.cow", &b, false, true) == -EINVAL);
  want.request = BIND_STARTUP;
  /* origin-moved vouches for it. */
  want.origin_moved = true;
  f = binding_facts (&want, &b, false, what, sizeof what);
  CHECK (!(f & BF_OTHER_ORIGIN) && (f & BF_ORIGIN_REBOUND));
  CHECK (binding_check (&want, "x.cow", &b, false, true) == 0);
  want.origin_moved = false;

  /* A record without identity: the path decides. */
  b.origin_dev = b.origin_ino = 0;
  CHECK (binding_origin_compare (&b, &dev, what, sizeof what)
         == BINDING_ORIGIN_SAME);
  device_close (&dev);

  /* Another size is another origin, origin-moved or not. */
  make_file (origin, 2 << 20);
  open_dev (&dev, origin);
  want.origin = &dev;
  want.origin_moved = true;
  CHECK (binding_origin_compare (&b, &dev, what, sizeof what)
         == BINDING_ORIGIN_OTHER);
  CHECK (strstr (what, "size") != NULL);
  f = binding_facts (&want, &b, false, what, sizeof what);
  CHECK (f & BF_OTHER_ORIGIN);
  CHECK (binding_check (&want, "x.cow", &b, false, true) == -EINVAL);
  device_close (&dev);

  /* A catalogue's snapshot: its own store, under its own name. */
  {
    struct binding_want r = {
      .request = BIND_RESTORE, .origin = &dev, .name = "s2",
      .catalogue_id = "dc370000-1111-4222-8333-444455556666",
    };
    open_dev (&dev, origin);
    binding_make (&r, NULL, &b);
    r.uuid = b.uuid;
    CHECK (binding_check (&r, "x.cow", &b, false, true) == 0);
    r.name = "s3";                      /* the records' names swapped */
    f = binding_facts (&r, &b, false, what, sizeof what);
    CHECK (f & BF_OTHER_NAME);
    CHECK (binding_check (&r, "x.cow", &b, false, true) == -EINVAL);
    r.name = "s2";
    r.uuid = "00000000-1111-4222-8333-444455556666";
    CHECK (binding_check (&r, "x.cow", &b, false, true) == -EINVAL);
    device_close (&dev);
  }

  /* A run-time create never takes an existing store. */
  open_dev (&dev, origin);
  want.origin = &dev;
  want.request = BIND_RUNTIME;
  binding_make (&want, NULL, &b);
  CHECK (binding_check (&want, "x.cow", &b, false, true) == -EBUSY);
  device_close (&dev);

  unlink (origin);
  rmdir (dir);
}

static void
quiet (const char *fmt, va_list ap)
{
  (void) fmt;
  (void) ap;
}

int
main (void)
{
  snapfg_set_log (quiet, quiet);
  snapfg_set_notice_log (quiet);
  test_encoding ();
  test_table ();
  test_origin_facts ();
  printf ("test-store-binding: ok\n");
  return 0;
}
