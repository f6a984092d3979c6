/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: a persistent store's binding record (docs/design.md section 7).
 *
 * dm's header holds 16 bytes: magic, valid, version, chunk size.  What it
 * cannot say -- which origin the store belongs to, which snapshot it
 * holds, how it was attached and whether it was dropped -- snapfg keeps
 * in the header chunk after it.  The kernel does not read these bytes
 * and leaves them alone while it uses a valid store; it rewrites the
 * header chunk (zeroing them) only when it invalidates the store, and an
 * Invalid store is never attached as valid anyway
 * (tests/test-guest-dm-interop.sh (d) and (e)):
 *
 *   bytes 16..31   the merge mark (dm-format.h)
 *   bytes 64..511  the binding record, little endian:
 *      0  magic "snapfgBR"          8  version (1)
 *     12  mode                      16 state
 *     24  created (unix seconds)    32 origin size
 *     40  origin st_dev             48 origin st_ino (st_rdev: block dev)
 *     56  FNV-1a 64 of the origin's full path or URI
 *     64  snapshot uuid (36 chars)  104 catalogue id (36 chars, or zero)
 *    144  snapshot name (64, NUL padded, may be cut short)
 *    208  origin path or URI (200, NUL padded, may be cut short)
 *    444  CRC-32 of bytes 0..443
 *
 * A store without the magic (written by the kernel, or by an older
 * snapfg) has no binding: it is accepted where it always was (cow= and
 * snapshot= at start-up) and gets one when snapfg first attaches it.
 *
 * The origin is the same one when the size is the same and its identity
 * is: a file's device and inode numbers, a block device's device number
 * (so a renamed origin, or one reached through another path, is still
 * the origin, and a file put in its place is not).  A record whose
 * identity is zero -- the origin was an NBD export, which has none, or
 * the record is older than that check -- is matched by path or URI and
 * size, and gains the identity when it is next written.  An operator
 * whose origin really did move (restored from a copy, a block device
 * renumbered) says so with origin-moved=true: a store of an origin of
 * the same size is then accepted and rebound to the origin as it is.
 */
#ifndef SNAPFG_STORE_BINDING_H
#define SNAPFG_STORE_BINDING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device.h"

#define STORE_BINDING_OFFSET 64
#define STORE_BINDING_SIZE 448

/* How a snapshot was attached: this decides who may bring it back. */
enum binding_mode {
  BINDING_STARTUP = 1,    /* cow= / snapshot= on the command line, no
                           * catalogue: the command line brings it back */
  BINDING_CATALOGUE = 2,  /* recorded in a catalogue (state=): only that
                           * catalogue brings it back */
  BINDING_RUNTIME = 3,    /* created at run time without a catalogue:
                           * forgotten at restart, never valid again */
};

enum binding_state {
  BINDING_ATTACHED = 1,
  BINDING_DROPPED = 2,    /* dropped: never valid again */
};

struct store_binding {
  bool present;           /* the record exists (and is intact) */
  uint32_t mode, state;
  int64_t created;
  uint64_t origin_size, origin_dev, origin_ino, origin_hash;
  char uuid[37];
  char catalogue_id[37];  /* "" if none */
  char name[65];
  char origin_path[201];
};

/* Why a store is being opened, and what the opener knows. */
enum binding_request {
  BIND_NONE = 0,          /* no checks, no record (transient; tools) */
  BIND_STARTUP,           /* cow=/snapshot= on the command line */
  BIND_RUNTIME,           /* create at run time: a new snapshot */
  BIND_RESTORE,           /* a catalogue's snapshot at restart */
};

struct binding_want {
  enum binding_request request;
  const struct snapfg_device *origin;
  const char *name;                /* the snapshot's export name */
  const char *catalogue_id;        /* NULL: no catalogue */
  const char *uuid;                /* BIND_RESTORE: the catalogue's */
  bool merge_expected;             /* BIND_RESTORE: the catalogue says
                                      this snapshot is being merged */
  bool origin_moved;               /* origin-moved=true: a store of an
                                      origin of the same size but another
                                      identity is this origin's */
  /* Is uuid one of the catalogue's snapshots?  (BIND_STARTUP with a
   * catalogue: a store the catalogue dropped or forgot is refused.)
   */
  bool (*catalogue_knows) (void *opaque, const char *uuid);
  void *opaque;
};

/* Encode / decode the record (decode: present = false if there is no
 * record; -EINVAL if the magic is there but the record is damaged).
 */
extern void binding_encode (const struct store_binding *b,
                            unsigned char out[STORE_BINDING_SIZE]);
extern int binding_decode (const unsigned char in[STORE_BINDING_SIZE],
                           struct store_binding *b);

/* A new record for a store attached for 'want' (keeps uuid and created
 * from 'old' if given and it is the same snapshot).
 */
extern void binding_make (const struct binding_want *want,
                          const struct store_binding *old,
                          struct store_binding *b);

/* How the origin a record names compares with 'origin'. */
enum binding_origin {
  BINDING_ORIGIN_SAME,          /* the same identity (or, without one,
                                   the same path or URI), the same size */
  BINDING_ORIGIN_REPLACED,      /* the same path and size, but another
                                   file or device is there now */
  BINDING_ORIGIN_OTHER,         /* another origin */
};

/* Compare; unless SAME, 'what' says what differs (recorded vs now). */
extern enum binding_origin
binding_origin_compare (const struct store_binding *b,
                        const struct snapfg_device *origin,
                        char *what, size_t what_len);

/* --- the decision (a table, store-binding.c) ---
 *
 * What is known about a store and its opener, as bits: */
enum binding_fact {
  BF_PRESENT = 1u << 0,         /* the store has a binding record */
  BF_OTHER_ORIGIN = 1u << 1,    /* ... of another origin (and
                                   origin-moved does not vouch for it) */
  BF_DROPPED = 1u << 2,         /* ... whose snapshot was dropped */
  BF_MODE_CATALOGUE = 1u << 3,  /* ... attached through a catalogue */
  BF_MODE_RUNTIME = 1u << 4,    /* ... created at run time, no catalogue */
  BF_MERGE_MARK = 1u << 5,      /* the header carries the merge mark */
  BF_HAVE_CATALOGUE = 1u << 6,  /* the opener has a catalogue */
  BF_SAME_CATALOGUE = 1u << 7,  /* the record names the opener's */
  BF_SAME_UUID = 1u << 8,       /* the record's uuid is the catalogue's
                                   record's (BIND_RESTORE) */
  BF_KNOWN = 1u << 9,           /* the catalogue knows the record's uuid */
  BF_MERGE_EXPECTED = 1u << 10, /* the catalogue records its merge */
  BF_OTHER_NAME = 1u << 12,     /* the record names another snapshot
                                   than the opener's */
  /* Not read by the table: the origin differs, and origin-moved=true
   * vouches for it (the store is rebound, with a notice).
   */
  BF_ORIGIN_REBOUND = 1u << 11,
};

enum binding_verdict {
  BV_ATTACH,                    /* 0 */
  BV_FINISH_DROP,               /* -ESTALE */
  BV_REFUSE,                    /* -EINVAL */
  BV_BUSY,                      /* -EBUSY */
};

/* Why: each refusal has its own message (binding_check logs it). */
enum binding_reason {
  BR_OK,
  BR_MERGE_TO_FINISH,           /* attach: a run-time snapshot's merge */
  BR_NOT_NEW,                   /* run-time create on an existing store */
  BR_OTHER_ORIGIN,
  BR_DROP_UNDER_WAY,            /* finish the drop */
  BR_DROPPED,
  BR_NOT_RECORDED_STORE,        /* restore: not the catalogue's store */
  BR_UNKNOWN_MERGE,             /* restore: a merge mark, no merge */
  BR_FORGOTTEN_RUNTIME,
  BR_NEEDS_CATALOGUE,
  BR_OTHER_CATALOGUE,
  BR_NOT_IN_CATALOGUE,
  BR_MERGE_WITHOUT_CATALOGUE,   /* startup with state=, merge-marked */
  BR_OTHER_NAME,                /* restore: the store holds another
                                   snapshot name than the record */
};

struct binding_decision {
  enum binding_verdict verdict;
  enum binding_reason reason;
};

/* The facts for an existing store (found: its record) and 'want'.  If
 * the origin differs, 'what' says how (for the message).
 */
extern unsigned binding_facts (const struct binding_want *want,
                               const struct store_binding *found,
                               bool merge_marked, char *what,
                               size_t what_len);
/* The decision the table gives a request with these facts (pure). */
extern struct binding_decision binding_decide (enum binding_request request,
                                               unsigned facts);

/* Decide whether an existing store (its header already read and valid)
 * may be attached for 'want'.  Returns 0 (attach), -ESTALE (BIND_RESTORE:
 * the store was dropped but the catalogue was not yet told: finish the
 * drop) or -EINVAL/-EBUSY after logging why, naming path and what to do.
 */
extern int binding_check (const struct binding_want *want, const char *path,
                          const struct store_binding *found,
                          bool merge_marked, bool valid);

extern const char *binding_mode_name (uint32_t mode);
extern const char *binding_state_name (uint32_t state);

#endif
