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

/* Does this record's origin identity name 'origin'? */
extern bool binding_origin_matches (const struct store_binding *b,
                                    const struct snapfg_device *origin);

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
