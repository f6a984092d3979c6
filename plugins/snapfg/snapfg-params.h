/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg plugin: its parameters (see nbdkit-snapfg-plugin(1)), shared
 * by snapfg-params.c, which parses them, and snapfg.c, which uses them
 * once they are all known.
 */
#ifndef SNAPFG_PLUGIN_PARAMS_H
#define SNAPFG_PLUGIN_PARAMS_H

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"
#include "store-types.h"
#include "vector.h"

/* snapshot=NAME:COW, repeatable: more snapshots at start-up. */
struct startup_snapshot {
  char *name;
  char *cow_path;
};
DEFINE_VECTOR_TYPE (startup_snapshot_vector, struct startup_snapshot);

struct plugin_params {
  char *origin_path;            /* realpath, or the URI as given */
  char *cow_path;               /* cow=: the snapshot "snapshot" */
  startup_snapshot_vector extra_snapshots;
  char *store_type;             /* NULL: the default */
  int64_t chunk_size;
  int64_t cow_size;             /* 0: not given */
  int64_t block_size;
  enum snapfg_locking locking;
  enum snapfg_durability durability;
  char *control_path;
  unsigned max_snapshots;
  char *state_path;
  int64_t cbt_granularity;
  bool cbt_granularity_given;
  bool writeback;               /* writeback=on|off */
  int64_t writeback_max;
  bool origin_moved;            /* origin-moved=true */
  char *held_dir;               /* held-dir=, or NULL: the default */
  bool held_dir_on_disk;        /* held-dir-on-disk=true */
};

/* The parameters as given so far (the defaults until then). */
extern struct plugin_params params;

/* The .config callback: one KEY=VALUE; -1 after an error naming it. */
extern int params_config (const char *key, const char *value);
/* Free what the parameters hold. */
extern void params_free (void);

/* Its --help text. */
#define plugin_config_help \
  "origin=<FILE>         (required) The origin: file, block device or NBD URI.\n" \
  "cow=<FILE>            COW store (file, block device or NBD URI) of \"snapshot\".\n" \
  "snapshot=<NAME>:<COW> Another snapshot exported as NAME (repeatable).\n" \
  "store=" SNAPFG_STORE_TYPE_CHOICES " Exception store (default " \
  SNAPFG_DEFAULT_STORE_TYPE ").\n" \
  "chunk-size=<SIZE>     Copy-out unit, power of two 512..1M (default 4K).\n" \
  "cow-size=<SIZE>       Most bytes the COW store may use.\n" \
  "block-size=512|4096   Advertised minimum block size (default 512).\n" \
  "locking=striped|global Exception table locking (default striped).\n" \
  "durability=sync|flush Persistent stores: sync every exception (default)\n" \
  "                      or only at client flush/FUA.\n" \
  "writeback=on|off      Acknowledge first writes once the old chunk is\n" \
  "                      copied, commit in the background (default on).\n" \
  "writeback-max=<SIZE>  Most bytes write-back holds (default: a sixteenth\n" \
  "                      of the memory, 64M to 1G).\n" \
  "held-dir=<DIR>        Where held writes outlive a crash of the server\n" \
  "                      (tmpfs; default $RUNTIME_DIRECTORY, $XDG_RUNTIME_DIR,\n" \
  "                      /run/snapfg).\n" \
  "held-dir-on-disk=true Allow a held-dir= that is not on tmpfs.\n" \
  "max-snapshots=<N>     Most snapshots at once (default 32).\n" \
  "control=<SOCKET>      Unix socket for snapfgctl (mode 0600).\n" \
  "state=<FILE>          The origin's catalogue: snapshots and checkpoints\n" \
  "                      survive restarts.\n" \
  "cbt-granularity=<SIZE> Checkpoint bitmap granule, power of two >= chunk-size\n" \
  "                      (default 64K).\n" \
  "origin-moved=true     The origin was moved or restored: accept a catalogue,\n" \
  "                      stores and bitmaps bound to another disk (or path)\n" \
  "                      of the same size."

#endif
