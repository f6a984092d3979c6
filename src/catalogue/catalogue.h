/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the origin's catalogue (state=FILE, docs/design.md section 7).
 *
 * One JSON object per origin, the way LVM keeps its metadata: every
 * snapshot the server has (persistent ones come back at restart, a
 * transient one is recorded as lost), the merge in progress, every
 * checkpoint (written by the checkpoint code through this API) and a
 * history of events.  Every change rewrites the file atomically (write
 * FILE.tmp, fsync, rename over FILE, fsync the directory), and the file
 * is held under an OFD lock for as long as the catalogue is open, so a
 * second server on the same catalogue refuses to start.
 *
 *   {
 *     "format": "snapfg-catalogue",
 *     "version": 1,
 *     "id": "<uuid of this catalogue>",
 *     "origin": { "path": "...", "size": N, "dev": D, "ino": I },
 *     "snapshots": [ { "name", "cow", "store", "chunk_size", "cow_size",
 *                      "created", "uuid", "state", "owned",
 *                      "temporary" (only when true) }, ... ],
 *     "checkpoints": [ { "name", "bitmap", "granularity", "created",
 *                        "seq", "state", "snapshot" }, ... ],
 *     "events": [ { "time", "event", "name", "detail" }, ... ]
 *   }
 *
 * The state directory FILE.d/ (mode 0700, created when first needed)
 * holds the stores of snapshots created without a COW path
 * (FILE.d/NAME.cow) and checkpoint bitmaps (FILE.d/NAME.cbt).
 *
 * Every function is thread-safe (one mutex per catalogue).  Functions
 * returning int return 0 or a negative errno and log an error naming
 * the catalogue file on failure; on failure the file is unchanged.
 */
#ifndef SNAPFG_CATALOGUE_H
#define SNAPFG_CATALOGUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct catalogue;

/* What identifies the origin a catalogue belongs to. */
struct catalogue_origin {
  const char *path;                /* realpath of the file, or the URI */
  uint64_t size;
  /* Its identity as device_identity gives it (a file's device and
   * inode, a block device's device number in ino); an NBD export has
   * none.  With one on both sides it decides, not the path.
   */
  bool has_identity;
  uint64_t dev, ino;
  bool moved;                      /* origin-moved=true: an origin of the
                                      same size is this one (rebound) */
};

/* A snapshot as the catalogue records it. */
#define CATALOGUE_SNAPSHOT_ACTIVE  "active"
#define CATALOGUE_SNAPSHOT_MERGING "merging"  /* merge in progress */

struct catalogue_snapshot {
  char *name;
  char *cow;                       /* path or URI of the COW store */
  char *store;                     /* a name of store-types.h */
  uint32_t chunk_size;
  uint64_t cow_size;               /* as asked for; 0: the default */
  int64_t created;                 /* unix seconds */
  char uuid[37];                   /* the store's binding (store-binding.h) */
  char *state;                     /* CATALOGUE_SNAPSHOT_* */
  bool owned;                      /* the COW is FILE.d/NAME.cow, made by us */
  bool temporary;                  /* made for one run of a tool: dropped at
                                      the next start (recorded only when
                                      true) */
};

/* A checkpoint (docs/design.md section 8; written by the checkpoint code). */
#define CATALOGUE_CHECKPOINT_ACTIVE       "active"
#define CATALOGUE_CHECKPOINT_FROZEN       "frozen"
#define CATALOGUE_CHECKPOINT_INCONSISTENT "inconsistent"

struct catalogue_checkpoint {
  char *name;
  char *bitmap;                    /* path of the bitmap file */
  uint64_t granularity;            /* bytes */
  int64_t created;                 /* unix seconds */
  uint64_t seq;                    /* creation order, increasing */
  char *state;                     /* CATALOGUE_CHECKPOINT_* */
  char *snapshot;                  /* created at the same instant, or NULL */
  char *owner;                     /* who made it, or NULL (optional) */
};

/* Open (or, if the file does not exist, create) the catalogue at path
 * for this origin, and lock it.  Refused, with an error naming the file
 * and saying what to do, if it is locked by another process, is not a
 * snapfg catalogue (it is never overwritten), is empty, truncated or
 * malformed (every record and field is checked), belongs to another
 * origin, is a symbolic link, is not owned by this process's user or is
 * writable by others (so is its state directory), or if its state
 * directory is missing while records name files in it.
 *
 * The catalogue opens held: changes are kept in memory until
 * catalogue_release writes them, so that a start which fails changes
 * nothing on disk (catalogue_abandon drops them).
 */
extern int catalogue_open (const char *path,
                           const struct catalogue_origin *origin,
                           struct catalogue **catp);
/* The start is done: write what changed while held (then remove the
 * files that the changes forgot), and write every later change at once.
 */
extern int catalogue_release (struct catalogue *cat);
/* Release the lock and free everything.  NULL is fine. */
extern void catalogue_close (struct catalogue *cat);
/* The same, after a failed start: a catalogue file that this open
 * created (and its empty state directory) is removed again if no
 * snapshot was recorded in it, so that a refused start leaves nothing
 * behind.  NULL is fine.
 */
extern void catalogue_abandon (struct catalogue *cat);

extern const char *catalogue_path (const struct catalogue *cat);
/* This catalogue's uuid ("id"), kept in the stores' bindings. */
extern const char *catalogue_id (const struct catalogue *cat);

/* FILE.d/NAME.EXT (ext: "cow", "cbt"), creating FILE.d (0700) if
 * needed.  Returns a malloc'd path, or NULL after logging why.  NAME
 * must be a plain file name (no '/', not "." or ".."): refused otherwise.
 */
extern char *catalogue_state_file (struct catalogue *cat, const char *name,
                                   const char *ext);
/* The state directory FILE.d, opened (O_DIRECTORY, O_NOFOLLOW) for
 * creating and opening files in it by name; created (0700) first if
 * create is true.  Refused unless it is a real directory owned by this
 * process's user and writable by nobody else.  Returns the descriptor
 * or a negative errno after logging why.
 */
extern int catalogue_state_dir_open (struct catalogue *cat, bool create);
/* Does path name a file that the server itself writes: FILE, FILE.tmp,
 * anything in FILE.d (a link to one of them included)?  Such a file can
 * never be a COW store given by path.  If so, says which in why.
 */
extern bool catalogue_names_own_file (struct catalogue *cat, const char *path,
                                      char *why, size_t len);

/* --- snapshots --- */

/* A copy of the list (free it with catalogue_snapshots_free). */
extern int catalogue_snapshots (struct catalogue *cat,
                                struct catalogue_snapshot **list, size_t *n);
extern void catalogue_snapshots_free (struct catalogue_snapshot *list,
                                      size_t n);
/* Add, or replace the one of the same name. */
extern int catalogue_snapshot_put (struct catalogue *cat,
                                   const struct catalogue_snapshot *s);
/* Set the state (CATALOGUE_SNAPSHOT_*) of a recorded snapshot. */
extern int catalogue_snapshot_set_state (struct catalogue *cat,
                                         const char *name, const char *state);
/* Remove it, recording why in the events: "dropped", "merged", "lost"
 * (a transient snapshot at restart).  -ENOENT if not recorded.  If file
 * is not NULL, it (the snapshot's store in FILE.d) is removed once the
 * catalogue that forgets the snapshot is on disk, never before.
 */
extern int catalogue_snapshot_remove (struct catalogue *cat, const char *name,
                                      const char *event, const char *detail);
extern int catalogue_snapshot_forget (struct catalogue *cat, const char *name,
                                      const char *event, const char *detail,
                                      const char *file);

/* --- checkpoints (the checkpoint code's) --- */

extern int catalogue_checkpoints (struct catalogue *cat,
                                  struct catalogue_checkpoint **list,
                                  size_t *n);
extern void catalogue_checkpoints_free (struct catalogue_checkpoint *list,
                                        size_t n);
/* Replace the whole list in one atomic rewrite (e.g. freeze the active
 * checkpoint and add the next one together).
 */
extern int catalogue_checkpoints_set (struct catalogue *cat,
                                      const struct catalogue_checkpoint *list,
                                      size_t n);

#endif
