/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the catalogue's internals, shared by its source files:
 *
 *   catalogue.c          open (with its checks), release, close, the state
 *                        directory, the server's own files
 *   catalogue-file.c     the file: reading it, the locked atomic
 *                        rewrite (commit), held changes
 *   catalogue-check.c    every record checked before a start uses it
 *   catalogue-records.c  the snapshot and checkpoint records
 *
 * Not for anyone else: the rest of snapfg uses catalogue.h.
 */
#ifndef SNAPFG_CATALOGUE_INTERNAL_H
#define SNAPFG_CATALOGUE_INTERNAL_H

#include <stdbool.h>
#include <pthread.h>

#include <jansson.h>

#include "catalogue.h"

struct catalogue {
  pthread_mutex_t lock;
  char *path;
  const char *base_name;           /* FILE's last component, in path */
  char *tmp_path;
  char *dir_path;                  /* the directory holding FILE */
  char *state_dir;                 /* FILE.d */
  int fd;                          /* FILE, OFD-locked */
  json_t *root;
  char id[37];
  bool created_now;                /* this open made the file */
  /* Where the files of the catalogue really are, for recognising a
   * path that names one of them (catalogue_names_own_file): the
   * catalogue's directory resolved, FILE, FILE.tmp and FILE.d in it.
   */
  char *real_path, *real_tmp_path, *real_state_dir;
  /* Held (from the open until catalogue_release): changes are made in
   * memory only, so that a start which fails half-way leaves the file
   * as it was (catalogue_abandon drops them).  pending: there are some.
   * unlink_after: files to remove once the change that forgets them is
   * on disk.
   */
  bool held, pending;
  char **unlink_after;
  size_t n_unlink_after;
};

/* Open and lock FILE (cat->fd), making sure the locked inode is still
 * the one the name points to.  *created: this call made the file.
 */
extern int catalogue_open_locked (struct catalogue *cat, bool *created);
/* Read and check the document (or make a new one for the empty file
 * this open has just created) into cat->root and cat->id.  *fresh: a
 * new catalogue.  Any other empty file is refused.
 */
extern int catalogue_load_document (struct catalogue *cat,
                                    const struct catalogue_origin *origin,
                                    bool *fresh);
/* The "origin" object for this origin (path, size and, if it has one,
 * its identity); NULL if out of memory.  (catalogue-origin.c)
 */
extern json_t *catalogue_origin_object (const struct catalogue_origin *origin);
/* Is the document (its "origin" object checked for type) this origin's
 * catalogue?  0, possibly with the origin object rebound in memory (an
 * identity gained, a renamed origin's path, origin-moved=true; written
 * by catalogue_release), or -EINVAL after logging what differs.
 */
extern int catalogue_check_origin (struct catalogue *cat, json_t *root,
                                   const struct catalogue_origin *origin);
/* Write doc as the new catalogue, atomically (FILE.tmp, sync, lock,
 * rename, sync the directory); doc is not consumed.  Called with
 * cat->lock held.
 */
extern int catalogue_write (struct catalogue *cat, json_t *doc);
/* Is v a uuid as random_uuid writes them (36 characters, lower-case
 * hex digits and dashes at 8, 13, 18 and 23)?
 */
extern bool catalogue_is_uuid (json_t *v);
/* Commit a changed copy DOC of the tree (consumed): write it, then
 * adopt it; on failure the file and cat->root are unchanged.  While
 * the catalogue is held, only adopted (catalogue_release writes it).
 * Called with cat->lock held.
 */
extern int catalogue_commit (struct catalogue *cat, json_t *doc);
/* Check every record of the document (types, values, duplicates, the
 * files it names); NULL if all is well, else what is wrong (in buf).
 */
extern const char *catalogue_check_records (struct catalogue *cat,
                                            json_t *root,
                                            char *buf, size_t len);
/* Add an event to DOC's history (kept to the last few hundred). */
extern void catalogue_append_event (json_t *doc, const char *event,
                                    const char *name, const char *detail);

#endif
