/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* nbd-check: libnbd client driver for the snapfg integration tests.
 *
 * Usage: nbd-check SUBCOMMAND [options] args...
 *
 *   semantics [opts] URI_ORIGIN URI_SNAPSHOT ORIGINAL [SEED]
 *       Random writes (aligned, unaligned, chunk-straddling, multi-chunk)
 *       to the origin and the snapshot, trim/zero/fast-zero, flush/FUA,
 *       block size and extents checks, all against an in-memory model.
 *   concurrency [opts] URI_ORIGIN URI_SNAPSHOT ORIGINAL SECONDS WRITERS READERS
 *       Threads with their own connections: writers write the origin,
 *       readers read the snapshot and compare every byte with ORIGINAL.
 *   failure MODE [opts] URI_ORIGIN URI_SNAPSHOT ORIGINAL
 *       MODE is invalid, overflow or overflow-invalid: fill a small COW
 *       store and check EIO (Invalid) or ENOSPC (Overflow) behaviour.
 *
 * Listing exports, reading the size, writing a pattern and comparing an
 * export with a file are done with nbdinfo, nbdsh and nbdcopy + cmp.
 *
 * Options (semantics, concurrency, failure):
 *   --chunk N            chunk size of the server (default 4096)
 *   --min N              expected advertised minimum block size
 *   --pref N             expected advertised preferred block size
 *   --aligned            send only requests aligned to the minimum block
 *                        size (otherwise strict alignment is switched off
 *                        and byte-granular requests are sent as well)
 *   --ops N              number of random writes (semantics)
 *   --seed N             random seed
 *   --expect-origin F    write the expected final origin contents to F
 *   --expect-snapshot F  write the expected final snapshot contents to F
 *   --region N           bytes of the export the concurrency writers use
 *   --snap-writers N     extra threads writing the snapshot (concurrency)
 *   --cow-chunks N       chunks the COW store can hold (failure)
 *   --min-held N         chunks the store must hold before it is full
 *                        (failure; default --cow-chunks)
 *   --verbose
 *
 * Exit status: 0 pass, 1 fail, 2 usage error.
 *
 * The subcommands live in files of their own; see nbd-check.h.
 */

#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "nbd-check.h"

static const struct {
  const char *name;
  int (*run) (int argc, char **argv);
} subcommands[] = {
  { "semantics", cmd_semantics },
  { "concurrency", cmd_concurrency },
  { "failure", cmd_failure },
};

int
main (int argc, char **argv)
{
  if (argc < 2) {
    fprintf (stderr, "usage: nbd-check semantics|concurrency|failure ...\n");
    return 2;
  }
  for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; ++i)
    if (strcmp (argv[1], subcommands[i].name) == 0)
      return subcommands[i].run (argc - 1, argv + 1);
  fprintf (stderr, "nbd-check: unknown subcommand '%s' (semantics, "
           "concurrency or failure; for list, status, fill, compare and "
           "size use nbdinfo, nbdsh, nbdcopy and cmp)\n", argv[1]);
  return 2;
}
