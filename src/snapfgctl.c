/* snapfgctl: inspect and control snapfg.
 *
 *   snapfgctl inspect [--exceptions] COW
 *
 * prints what a COW store holds (header, usage as dm's status line, and
 * optionally every exception) without writing to it, and exits non-zero
 * with a message naming the problem when the store is corrupt.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <getopt.h>

#include "device.h"
#include "dm-format.h"
#include "exception-table.h"
#include "snapfg-log.h"

static void
usage (FILE *fp)
{
  fprintf (fp,
           "usage: snapfgctl inspect [--exceptions] COW\n"
           "\n"
           "  inspect COW     print the header and usage of a COW store\n"
           "                  (dm-snapshot persistent format); read only\n"
           "  --exceptions    also print every exception: old_chunk new_chunk\n");
}

struct inspect_state {
  struct exception_table seen;    /* finds two pairs for one old chunk */
  bool print;
};

static int
inspect_pair (void *opaque, uint64_t old_chunk, uint64_t new_chunk)
{
  struct inspect_state *is = opaque;
  int r = exception_table_insert (&is->seen, old_chunk, new_chunk);

  if (r < 0)
    return r;
  if (is->print)
    printf ("%" PRIu64 " %" PRIu64 "\n", old_chunk, new_chunk);
  return 0;
}

static int
cmd_inspect (int argc, char *argv[])
{
  static const struct option long_options[] = {
    { "exceptions", no_argument, NULL, 'e' },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 },
  };
  struct inspect_state is = { .print = false };
  struct snapfg_device dev;
  struct dm_header h;
  enum dm_header_kind kind;
  struct dm_load_result res;
  char why[256];
  const char *path;
  uint32_t chunk_size;
  uint64_t sectors_per_chunk, total;
  int c, r;

  optind = 1;
  while ((c = getopt_long (argc, argv, "eh", long_options, NULL)) != -1) {
    switch (c) {
    case 'e': is.print = true; break;
    case 'h': usage (stdout); return 0;
    default: usage (stderr); return 2;
    }
  }
  if (optind != argc - 1) {
    usage (stderr);
    return 2;
  }
  path = argv[optind];

  r = device_open (&dev, path, true);
  if (r == -EINVAL) {
    fprintf (stderr, "snapfgctl: %s: not a regular file or block device\n",
             path);
    return 1;
  }
  if (r < 0) {
    fprintf (stderr, "snapfgctl: %s: %s\n", path, strerror (-r));
    return 1;
  }
  r = dm_read_header (&dev, &h, &kind, why, sizeof why);
  if (r < 0) {
    fprintf (stderr, "snapfgctl: %s: %s\n", path, why);
    device_close (&dev);
    return 1;
  }
  printf ("COW store: %s (%" PRIu64 " bytes)\n", path, dev.size);
  if (kind == DM_HEADER_EMPTY) {
    printf ("empty: all zero, no header; a new snapshot would start here\n");
    device_close (&dev);
    return 0;
  }
  chunk_size = h.chunk_sectors * 512;
  sectors_per_chunk = h.chunk_sectors;
  printf ("magic: 0x%08" PRIx32 " (SnAp)\n", h.magic);
  printf ("valid: %" PRIu32 "\n", h.valid);
  printf ("version: %" PRIu32 "\n", h.version);
  printf ("chunk size: %" PRIu32 " sectors (%" PRIu32 " bytes)\n",
          h.chunk_sectors, chunk_size);
  printf ("pairs per metadata area: %" PRIu64 "\n",
          dm_pairs_per_area (chunk_size));
  total = dev.size / chunk_size * sectors_per_chunk;
  if (h.valid == 0) {
    /* dm does not read the table of an Invalid snapshot either. */
    printf ("status: Invalid\n");
    device_close (&dev);
    return 0;
  }

  if (exception_table_init (&is.seen, 8) < 0) {
    fprintf (stderr, "snapfgctl: out of memory\n");
    device_close (&dev);
    return 1;
  }
  if (is.print)
    printf ("exceptions (old_chunk new_chunk):\n");
  r = dm_load_exceptions (&dev, chunk_size, 0, inspect_pair, &is, &res,
                          why, sizeof why);
  exception_table_destroy (&is.seen);
  device_close (&dev);
  if (r < 0) {
    fflush (stdout);
    fprintf (stderr, "snapfgctl: %s: corrupt store: %s\n", path, why);
    return 1;
  }
  printf ("exceptions: %" PRIu64 "\n", res.exceptions);
  printf ("metadata areas: %" PRIu64 "\n", res.current_area + 1);
  printf ("next free chunk: %" PRIu64 "\n", res.next_free);
  /* As dmsetup status prints it, with the file's size as the total. */
  printf ("status: %" PRIu64 "/%" PRIu64 " %" PRIu64 "\n",
          res.next_free * sectors_per_chunk, total,
          (res.current_area + 2) * sectors_per_chunk);
  return 0;
}

int
main (int argc, char *argv[])
{
  if (argc < 2 || strcmp (argv[1], "--help") == 0 ||
      strcmp (argv[1], "-h") == 0) {
    usage (argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (strcmp (argv[1], "inspect") == 0)
    return cmd_inspect (argc - 1, argv + 1);
  fprintf (stderr, "snapfgctl: unknown command '%s'\n", argv[1]);
  usage (stderr);
  return 2;
}
