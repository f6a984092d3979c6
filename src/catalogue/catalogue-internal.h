/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the catalogue's internals, shared by its source files:
 *
 *   catalogue.c          open, close, the state directory, events
 *   catalogue-file.c     the file: reading and checking it, the locked
 *                        atomic rewrite (commit)
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
};

/* Open and lock FILE (cat->fd), making sure the locked inode is still
 * the one the name points to.  *created: this call made the file.
 */
extern int catalogue_open_locked (struct catalogue *cat, bool *created);
/* Read and check the document (or make a new one for an empty file)
 * into cat->root and cat->id.  *fresh: the file was empty.
 */
extern int catalogue_load_document (struct catalogue *cat,
                                    const struct catalogue_origin *origin,
                                    bool *fresh);
/* Commit a changed copy DOC of the tree (consumed): write it, then
 * adopt it; on failure the file and cat->root are unchanged.  Called
 * with cat->lock held.
 */
extern int catalogue_commit (struct catalogue *cat, json_t *doc);
/* Add an event to DOC's history (kept to the last few hundred). */
extern void catalogue_append_event (json_t *doc, const char *event,
                                    const char *name, const char *detail);

#endif
