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
#include <sys/sysmacros.h>

#include "byte-order.h"
#include "random-uuid.h"
#include "store-binding.h"
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

/* A record's or a device's identity, for messages. */
static void
describe_identity (uint64_t dev, uint64_t ino, char *out, size_t len)
{
  if (ino == 0)
    snprintf (out, len, "no identity recorded");
  else if (dev == 0)            /* a block device: its device number */
    snprintf (out, len, "block device %u:%u", major (ino), minor (ino));
  else
    snprintf (out, len, "device %" PRIu64 " inode %" PRIu64, dev, ino);
}

enum binding_origin
binding_origin_compare (const struct store_binding *b,
                        const struct snapfg_device *origin,
                        char *what, size_t what_len)
{
  struct device_identity id;
  bool have_id = device_identity (origin, &id);
  bool same_path = b->origin_hash == fnv1a64 (origin->path);
  char was[64], now[64];

  if (what_len)
    what[0] = '\0';
  if (b->origin_size != origin->size) {
    snprintf (what, what_len, "its size was %" PRIu64 " bytes, it is %"
              PRIu64 " now", b->origin_size, origin->size);
    return BINDING_ORIGIN_OTHER;
  }
  /* Both have an identity: it decides.  A renamed origin, or one reached
   * by another path, is the origin; a file renamed into its place (the
   * same path and size) is not: nothing says the store and it stayed
   * together.
   */
  if (b->origin_ino != 0 && have_id) {
    if (b->origin_dev == id.dev && b->origin_ino == id.ino)
      return BINDING_ORIGIN_SAME;
    describe_identity (b->origin_dev, b->origin_ino, was, sizeof was);
    describe_identity (id.dev, id.ino, now, sizeof now);
    snprintf (what, what_len, "it was %s, %s is %s now", was,
              same_path ? "the same path" : origin->path, now);
    return same_path ? BINDING_ORIGIN_REPLACED : BINDING_ORIGIN_OTHER;
  }
  /* No identity to compare (an NBD origin has none; a record may be
   * older than the check): the path or URI and the size.
   */
  if (same_path)
    return BINDING_ORIGIN_SAME;
  snprintf (what, what_len, "it was %s", b->origin_path);
  return BINDING_ORIGIN_OTHER;
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
    random_uuid (b->uuid);
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

/* --- the decision ---
 *
 * Who may attach an existing store is a table: the first rule whose
 * request matches, whose 'set' facts are all set and whose 'clear' facts
 * are all clear gives the verdict.  The order is the order of the
 * questions: a run-time create never takes an existing store; a store of
 * another origin or of a dropped snapshot is never valid again; a
 * catalogue's snapshot must be its own store; a store named on the
 * command line must not belong to somebody else.
 */
struct binding_rule {
  unsigned requests;            /* 1 << enum binding_request */
  unsigned set, clear;          /* enum binding_fact bits */
  enum binding_verdict verdict;
  enum binding_reason reason;
};

#define RQ(r) (1u << (r))
#define STARTUP RQ (BIND_STARTUP)
#define RESTORE RQ (BIND_RESTORE)

static const struct binding_rule rules[] = {
  { RQ (BIND_NONE), 0, 0, BV_ATTACH, BR_OK },
  /* A snapshot taken now is the origin as it is now; a store that
   * already holds one is some other instant's, whatever it says.
   */
  { RQ (BIND_RUNTIME), 0, 0, BV_BUSY, BR_NOT_NEW },
  { STARTUP | RESTORE, BF_PRESENT | BF_OTHER_ORIGIN, 0,
    BV_REFUSE, BR_OTHER_ORIGIN },
  /* Dropped, and the catalogue still has it: the drop was under way. */
  { RESTORE, BF_PRESENT | BF_DROPPED | BF_SAME_UUID, 0,
    BV_FINISH_DROP, BR_DROP_UNDER_WAY },
  { STARTUP | RESTORE, BF_PRESENT | BF_DROPPED, 0, BV_REFUSE, BR_DROPPED },
  /* A catalogue's snapshot: its own store, bound to it. */
  { RESTORE, 0, BF_PRESENT, BV_REFUSE, BR_NOT_RECORDED_STORE },
  { RESTORE, 0, BF_MODE_CATALOGUE, BV_REFUSE, BR_NOT_RECORDED_STORE },
  { RESTORE, 0, BF_SAME_UUID, BV_REFUSE, BR_NOT_RECORDED_STORE },
  { RESTORE, 0, BF_SAME_CATALOGUE, BV_REFUSE, BR_NOT_RECORDED_STORE },
  { RESTORE, BF_MERGE_MARK, BF_MERGE_EXPECTED, BV_REFUSE, BR_UNKNOWN_MERGE },
  /* The record and its store agree on the name too (the uuid alone does
   * not say it): records whose names were swapped would serve each
   * other's data under the wrong names.
   */
  { RESTORE, BF_OTHER_NAME, 0, BV_REFUSE, BR_OTHER_NAME },
  { RESTORE, 0, 0, BV_ATTACH, BR_OK },
  /* Named on the command line (cow=, snapshot=).  An interrupted merge
   * of a run-time snapshot: the origin is half merged, and only
   * finishing the merge makes it whole again.
   */
  { STARTUP, BF_PRESENT | BF_MODE_RUNTIME | BF_MERGE_MARK, BF_HAVE_CATALOGUE,
    BV_ATTACH, BR_MERGE_TO_FINISH },
  { STARTUP, BF_PRESENT | BF_MODE_RUNTIME, 0,
    BV_REFUSE, BR_FORGOTTEN_RUNTIME },
  { STARTUP, BF_PRESENT | BF_MODE_CATALOGUE, BF_HAVE_CATALOGUE,
    BV_REFUSE, BR_NEEDS_CATALOGUE },
  { STARTUP, BF_PRESENT | BF_MODE_CATALOGUE, BF_SAME_CATALOGUE,
    BV_REFUSE, BR_OTHER_CATALOGUE },
  { STARTUP, BF_PRESENT | BF_MODE_CATALOGUE, BF_KNOWN,
    BV_REFUSE, BR_NOT_IN_CATALOGUE },
  { STARTUP, BF_PRESENT | BF_MODE_CATALOGUE, 0, BV_ATTACH, BR_OK },
  { STARTUP, BF_HAVE_CATALOGUE | BF_MERGE_MARK, 0,
    BV_REFUSE, BR_MERGE_WITHOUT_CATALOGUE },
  { STARTUP, 0, 0, BV_ATTACH, BR_OK },
};

#undef RQ
#undef STARTUP
#undef RESTORE

struct binding_decision
binding_decide (enum binding_request request, unsigned facts)
{
  for (size_t i = 0; i < sizeof rules / sizeof rules[0]; ++i) {
    const struct binding_rule *r = &rules[i];

    if ((r->requests & (1u << request)) && (facts & r->set) == r->set &&
        (facts & r->clear) == 0)
      return (struct binding_decision) { r->verdict, r->reason };
  }
  /* Every request has a last rule without conditions. */
  return (struct binding_decision) { BV_REFUSE, BR_NOT_NEW };
}

unsigned
binding_facts (const struct binding_want *want,
               const struct store_binding *found, bool merge_marked,
               char *what, size_t what_len)
{
  unsigned f = 0;

  if (what_len)
    what[0] = '\0';
  if (merge_marked)
    f |= BF_MERGE_MARK;
  if (want->catalogue_id)
    f |= BF_HAVE_CATALOGUE;
  if (want->merge_expected)
    f |= BF_MERGE_EXPECTED;
  if (!found->present)
    return f;
  f |= BF_PRESENT;
  if (want->origin &&
      binding_origin_compare (found, want->origin, what, what_len)
      != BINDING_ORIGIN_SAME) {
    /* origin-moved=true vouches for an origin of the same size. */
    if (want->origin_moved && found->origin_size == want->origin->size)
      f |= BF_ORIGIN_REBOUND;
    else
      f |= BF_OTHER_ORIGIN;
  }
  if (found->state == BINDING_DROPPED)
    f |= BF_DROPPED;
  if (found->mode == BINDING_CATALOGUE)
    f |= BF_MODE_CATALOGUE;
  if (found->mode == BINDING_RUNTIME)
    f |= BF_MODE_RUNTIME;
  if (want->catalogue_id &&
      strcmp (found->catalogue_id, want->catalogue_id) == 0)
    f |= BF_SAME_CATALOGUE;
  if (want->uuid && strcmp (found->uuid, want->uuid) == 0)
    f |= BF_SAME_UUID;
  /* (A record's name may be cut short; an empty one says nothing.) */
  if (found->name[0] && want->name &&
      strncmp (found->name, want->name, sizeof found->name - 1) != 0)
    f |= BF_OTHER_NAME;
  if (want->catalogue_knows &&
      want->catalogue_knows (want->opaque, found->uuid))
    f |= BF_KNOWN;
  return f;
}

/* Say why the store is refused: the file, the reason, the way out. */
static int
log_refusal (int err, enum binding_reason reason,
             const struct binding_want *want, const char *path,
             const struct store_binding *found, unsigned facts,
             const char *what)
{
  const char *name = want->name;

  switch (reason) {
  case BR_NOT_NEW:
    snapfg_fail (err, "cow=%s: already holds a snapshot store%s; a snapshot "
                      "created at run time needs a new, empty or all-zero COW "
                      "file (an existing store comes back only at start-up, "
                      "through state= or cow=/snapshot=); the file is left "
                      "unchanged", path,
                      facts & BF_MERGE_MARK ? " with a merge in progress (the "
                      "origin is half merged: restart with this store to "
                      "finish it)"
                      : facts & BF_DROPPED ? " whose snapshot was dropped" : "");
    break;
  case BR_OTHER_ORIGIN:
    if (binding_origin_compare (found, want->origin, NULL, 0)
        == BINDING_ORIGIN_REPLACED)
      snapfg_fail (err, "cow=%s: the origin was replaced since this store was "
                        "bound to it: origin=%s has the same path and size, "
                        "but %s, so this store's snapshot is of another disk; "
                        "the file is left unchanged (if the origin really is "
                        "the same disk -- restored from a copy, or a block "
                        "device renumbered -- start once with "
                        "origin-moved=true to rebind the store to it)",
                        path, want->origin->path, what);
    else
      snapfg_fail (err, "cow=%s: this store belongs to another origin (%s, %"
                        PRIu64 " bytes), not to origin=%s (%s); a snapshot "
                        "store only serves the origin it was taken of (the file "
                        "is left unchanged%s)", path, found->origin_path,
                        found->origin_size, want->origin->path, what,
                        found->origin_size == want->origin->size
                        ? "; if it really is that origin, moved, start once "
                        "with origin-moved=true" : "");
    break;
  case BR_DROPPED:
    snapfg_fail (err, "cow=%s: snapshot \"%s\" in this store was dropped; the "
                      "origin has changed since, so it can never be a valid "
                      "snapshot again (delete the file, or use a new one); the "
                      "file is left unchanged", path, found->name);
    break;
  case BR_NOT_RECORDED_STORE:
    snapfg_fail (err, "cow=%s: not the store the catalogue recorded for "
                      "snapshot \"%s\" (uuid %s; the file holds %s%s); the "
                      "file is left unchanged: put the right store back, or "
                      "remove the snapshot's record from the catalogue",
                      path, name, want->uuid ? want->uuid : "?",
                      found->present ? "uuid " : "no snapfg binding",
                      found->present ? found->uuid : "");
    break;
  case BR_UNKNOWN_MERGE:
    snapfg_fail (err, "cow=%s: snapshot \"%s\" carries a merge mark, but the "
                      "catalogue records no merge of it; refusing to guess "
                      "which view of the origin is right (the file is left "
                      "unchanged)", path, name);
    break;
  case BR_OTHER_NAME:
    snapfg_fail (err, "cow=%s: the catalogue records this store as snapshot "
                      "\"%s\" (uuid %s), but the store holds snapshot \"%s\" "
                      "(uuid %s); refusing to serve it under another name (the "
                      "file is left unchanged): correct the catalogue record",
                      path, name, want->uuid ? want->uuid : "?",
                      found->name, found->uuid);
    break;
  case BR_FORGOTTEN_RUNTIME:
    snapfg_fail (err, "cow=%s: snapshot \"%s\" in this store was created at "
                      "run time without state= and forgotten when its server "
                      "stopped; the origin may have changed since, so it "
                      "cannot be attached as a valid snapshot (use state= to "
                      "keep run-time snapshots across restarts; the file is "
                      "left unchanged)", path, found->name);
    break;
  case BR_NEEDS_CATALOGUE:
    snapfg_fail (err, "cow=%s: snapshot \"%s\" in this store belongs to a "
                      "catalogue (id %s); only that catalogue can bring it "
                      "back: start with its state= file (the file is left "
                      "unchanged)", path, found->name, found->catalogue_id);
    break;
  case BR_OTHER_CATALOGUE:
    snapfg_fail (err, "cow=%s: snapshot \"%s\" in this store belongs to "
                      "another catalogue (id %s, not %s); the file is left "
                      "unchanged", path, found->name, found->catalogue_id,
                      want->catalogue_id);
    break;
  case BR_NOT_IN_CATALOGUE:
    snapfg_fail (err, "cow=%s: snapshot \"%s\" in this store was dropped "
                      "from or forgotten by the catalogue; the origin may "
                      "have changed since, so it cannot be attached as a "
                      "valid snapshot (the file is left unchanged)",
                      path, found->name);
    break;
  case BR_MERGE_WITHOUT_CATALOGUE:
    snapfg_fail (err, "cow=%s: this store carries a merge in progress that "
                      "the catalogue does not know of; restart once without "
                      "state= to finish the merge (the file is left "
                      "unchanged)", path);
    break;
  case BR_OK: case BR_MERGE_TO_FINISH: case BR_DROP_UNDER_WAY:
    break;
  }
  return -err;
}

int
binding_check (const struct binding_want *want, const char *path,
               const struct store_binding *found, bool merge_marked,
               bool valid)
{
  char what[256];
  unsigned facts;
  struct binding_decision d;

  if (want->request == BIND_NONE)
    return 0;
  facts = binding_facts (want, found, merge_marked, what, sizeof what);
  d = binding_decide (want->request, facts);
  switch (d.verdict) {
  case BV_ATTACH:
    if (facts & BF_ORIGIN_REBOUND)
      snapfg_notice ("cow=%s: origin-moved=true: this store was bound to "
                     "origin %s (%s); it is rebound to origin=%s as it is "
                     "now", path, found->origin_path, what,
                     want->origin->path);
    return 0;
  case BV_FINISH_DROP:
    return -ESTALE;
  case BV_BUSY:
    return log_refusal (EBUSY, d.reason, want, path, found, facts, what);
  case BV_REFUSE:
    break;
  }
  return log_refusal (EINVAL, d.reason, want, path, found, facts, what);
}
