/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: the commands on a repository (docs/repository.md):
 * deduplicated, compressed, encrypted chunks on a directory or an S3
 * object store, every run a full point.  A backup DIR that is not a
 * repository keeps the qcow2 chains (snapfg-backup.h).
 *
 *   snapfg-backup-repo-main.c     which command line is for a repository;
 *                                 its options; init
 *   snapfg-backup-repo-run.c      backup into a repository: one run in
 *                                 phases, driven for one disk or as one
 *                                 of a group (repo_run_kind)
 *   snapfg-backup-repo-restore.c  restore, and reading a point's chunks
 *                                 with several threads (verify too)
 *   snapfg-backup-repo-manage.c   verify, list, prune, gc
 */
#ifndef SNAPFG_BACKUP_REPO_H
#define SNAPFG_BACKUP_REPO_H

#include <stdbool.h>
#include <stdint.h>

#include "snapfg-backup.h"
#include "repo-admin.h"
#include "repo-retention.h"

struct repo_options {
  struct backup_options b;      /* the server, -H, --json, --at, --all,
                                   --full, --key-file */
  const char *disk;             /* --disk NAME */
  bool encrypt;                 /* init --encrypt */
  bool compress;                /* backup --compress (zstd) */
  bool dry_run;                 /* prune, gc */
  long keep[REPO_KEEP_N];       /* prune --keep-* (0: not given) */
  bool keep_given;
  int64_t grace;                /* gc --grace SECONDS (-1: default) */
  unsigned threads;             /* --threads N (0: the default) */
  struct repo_s3_options s3;
};

/* Is this command line one for a repository (init, gc, or REPO an
 * s3:// URL or a directory with a repository's config)?
 */
extern bool repo_command_line (int argc, char *argv[]);
/* Run it: the exit status. */
extern int repo_main (int argc, char *argv[]);

extern int repo_cmd_backup (struct repo_options *o, const char *location);
/* Several --disks at one instant, or hooks (snapfg-backup-group.c). */
extern int repo_cmd_backup_group (struct repo_options *o,
                                  const char *location);
extern const struct group_run_kind repo_run_kind;
extern int repo_cmd_restore (struct repo_options *o, const char *location,
                             const char *out);
extern int repo_cmd_verify (struct repo_options *o, const char *location);
extern int repo_cmd_list (struct repo_options *o, const char *location);
extern int repo_cmd_prune (struct repo_options *o, const char *location);
extern int repo_cmd_gc (struct repo_options *o, const char *location);

/* Open the repository, with the key if given: the exit status (after a
 * message) or 0.  need_key: the command reads or writes chunks.
 */
extern int repo_open_for (struct repo_options *o, const char *location,
                          bool need_key, struct repo **r);

/* The exit status for a failed library call, after its message. */
extern int repo_fail (int err, const char *context);

/* Read chunks [0, n) of ix with threads, calling fn (in those threads,
 * one call at a time per chunk, in no order) with each chunk's plain
 * data, or with buf NULL and the error when it cannot be read.  fn
 * returns 0, or -1 to stop everything.  Returns 0, or -1 if fn stopped
 * it.
 */
typedef int (*repo_chunk_fn) (void *opaque, unsigned thread, uint64_t n,
                              const char *buf, int err, const char *msg);
extern int repo_read_point (struct repo *r, const struct repo_index *ix,
                            unsigned threads, const char *what,
                            repo_chunk_fn fn, void *opaque);

/* The default number of threads reading, compressing, encrypting. */
#define REPO_DEFAULT_THREADS 4

#endif
