/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: full and incremental backups of a snapfg origin into a
 * chain of qcow2 images.  Declarations shared by its source files:
 *
 *   snapfg-backup.c           command line, the backup and restore runs
 *   snapfg-backup-control.c   the control socket client (JSON lines)
 *   snapfg-backup-copy.c      the libnbd copy engine (many requests in
 *                             flight over several connections)
 *   snapfg-backup-manifest.c  DIR/manifest.json and the block sums files
 */
#ifndef SNAPFG_BACKUP_H
#define SNAPFG_BACKUP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <signal.h>

#include <jansson.h>
#include <libnbd.h>

#define SHA256_LEN 32

/* Exit statuses (documented in snapfg-backup(1)). */
enum {
  EXIT_OK = 0,
  EXIT_FAILED = 1,
  EXIT_USAGE = 2,
  EXIT_NEED_FULL = 3,           /* an incremental is impossible: --full */
};

/* Set by SIGINT/SIGTERM: the copy stops, waits for its requests in
 * flight and the run is cleaned up and fails.
 */
extern volatile sig_atomic_t backup_interrupted;

/* Print "snapfg-backup: MESSAGE" on stderr (ends any progress line). */
extern void backup_error (const char *fmt, ...)
  __attribute__ ((format (printf, 1, 2)));
extern void backup_info (const char *fmt, ...)
  __attribute__ ((format (printf, 1, 2)));

/* --- control socket client --- */

/* Send REQ (not consumed) to the control socket and read the reply.
 * Returns the reply when it says "ok": true; otherwise NULL with the
 * server's message (or what went wrong talking to it) in err.
 */
extern json_t *control_call (const char *socket_path, json_t *req,
                             char *err, size_t err_len);

/* --- copy engine --- */

struct copy_range {
  uint64_t offset, length;
};

struct copy_job {
  struct nbd_handle **src;      /* connections to the snapshot */
  size_t nsrc;
  struct nbd_handle *dst;       /* the image being written; NULL: verify */
  const struct copy_range *ranges; /* sorted, disjoint, block aligned */
  size_t nranges;
  uint64_t size;                /* disk size (the last block may be short) */
  uint64_t block;               /* checksum block size, a power of two */
  unsigned char *sums;          /* SHA256_LEN per block; updated */
  bool write_zeroes;            /* all-zero blocks: write zeroes (an
                                   overlay) rather than skip (a new image) */
  const char *what;             /* for the progress line and errors */
  uint64_t stop_after;          /* test hook: stop after this many bytes */

  /* Results. */
  uint64_t bytes_read, bytes_written, bytes_zeroed;
};

/* Copy (or with dst NULL, only read and checksum) every range.  Waits
 * for every request in flight before returning, even on failure.
 * Returns 0, or -1 with a message in err.
 */
extern int copy_run (struct copy_job *job, char *err, size_t err_len);

/* The SHA-256 of LEN zero bytes. */
extern void sha256_zero (uint64_t len, unsigned char out[SHA256_LEN]);
extern int sha256_buf (const void *buf, size_t len,
                       unsigned char out[SHA256_LEN]);
extern void hex_digest (const unsigned char d[SHA256_LEN], char out[65]);

/* --- manifest and sums files --- */

/* Read DIR/manifest.json: NULL with *missing set when there is none,
 * NULL with a message when it cannot be read or is not a manifest.
 */
extern json_t *manifest_read (int dirfd, const char *dir, bool *missing,
                              char *err, size_t err_len);
/* Write it atomically: tmp file, fsync, rename, fsync DIR. */
extern int manifest_write (int dirfd, const char *dir, json_t *manifest,
                           char *err, size_t err_len);

/* Block sums: a file of SHA256_LEN bytes per block, with a header. */
extern int sums_write (int dirfd, const char *name, uint64_t block,
                       uint64_t size, const unsigned char *sums,
                       char *err, size_t err_len);
extern unsigned char *sums_read (int dirfd, const char *name,
                                 uint64_t block, uint64_t size,
                                 char *err, size_t err_len);
/* SHA-256 over the sums of the blocks in the ranges (what a run copied)
 * or over all of them (the whole disk at the run's instant).
 */
extern void sums_digest (const unsigned char *sums, uint64_t block,
                         const struct copy_range *ranges, size_t nranges,
                         uint64_t size, unsigned char out[SHA256_LEN]);

/* fsync a directory. */
extern int fsync_dir (int dirfd);

#endif
