/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: full and incremental backups of a snapfg origin into a
 * chain of qcow2 images.  Declarations shared by its source files:
 *
 *   snapfg-backup-main.c      the command line (main)
 *   snapfg-backup-util.c      running qemu-img; the line that ends a run
 *   snapfg-backup-session.c   the session with the server: the control
 *                             connection, local or over SSH (-H), and
 *                             the NBD URI the data comes through
 *   snapfg-backup-run.c       the backup command (one run)
 *   snapfg-backup-restore.c   the restore command
 *   snapfg-backup-dir.c       the backup directory: lock, names, leftovers
 *   snapfg-backup-nbd.c       NBD connections (server, qemu-nbd), extents
 *   snapfg-backup-control.c   control requests through the session (the
 *                             control client shared with snapfgctl,
 *                             tools/common/control-client.c)
 *   snapfg-backup-copy.c      the libnbd copy engine (many requests in
 *                             flight over several connections)
 *   snapfg-backup-manifest.c  DIR/manifest.json and the block sums files
 *   snapfg-backup-image.c     the qcow2 images: created exclusively, opened
 *                             through qemu-nbd (keys, compression), the
 *                             chain checked against the manifest
 *   snapfg-backup-verify.c    the verify and list commands
 *   snapfg-backup-prune.c     the prune command
 */
#ifndef SNAPFG_BACKUP_H
#define SNAPFG_BACKUP_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <signal.h>
#include <limits.h>
#include <pthread.h>
#include <sys/types.h>

#include <jansson.h>
#include <libnbd.h>

#define SHA256_LEN 32

#include "control-client.h"
#include "tool-exit.h"
#include "tool-output.h"

/* Exit statuses: the table both tools share (tool-exit.h, documented in
 * snapfg-backup(1) and snapfgctl(1)).
 */
enum {
  EXIT_OK = TOOL_EXIT_OK,
  EXIT_FAILED = TOOL_EXIT_FAILED,
  EXIT_USAGE = TOOL_EXIT_USAGE,
  EXIT_NEED_FULL = TOOL_EXIT_NEED_FULL, /* an incremental is impossible */
  EXIT_UNREACHABLE = TOOL_EXIT_UNREACHABLE,
  EXIT_TIMEOUT = TOOL_EXIT_TIMEOUT,
};

/* Set by SIGINT/SIGTERM: the copy stops, waits for its requests in
 * flight and the run is cleaned up and fails.
 */
extern atomic_int backup_interrupted;

/* Print "snapfg-backup: MESSAGE" on stderr (ends any progress line;
 * an error is also the "error" of the --json result).
 */
#define backup_error tool_error
#define backup_info tool_info

/* The command line's options, as main checked them. */
struct backup_options {
  const char *socket;           /* the control socket (on HOST with -H) */
  const char *uri;              /* the NBD URI as the server sees it */
  const char *host;             /* -H [USER@]HOST[:PORT], or NULL */
  char **ssh_options;           /* --ssh-option, each given to ssh -o */
  size_t nssh_options;
  const char *remote_snapfgctl; /* snapfgctl on HOST (default: snapfgctl) */
  int timeout;                  /* --timeout: seconds for each reply */
  const char *cow_dir;          /* absolute, or NULL */
  bool full;
  long at;                      /* -1: the latest run */
  const char *format;
  bool no_verify;               /* restore: --no-verify */
  bool diff;                    /* backup: --diff (since the last full) */
  const char *compress;         /* backup: --compress[=zstd|zlib], or NULL */
  bool encrypt;                 /* backup: --encrypt */
  const char *key_file;         /* --key-file F, or NULL */
  bool all;                     /* verify: --all */
  long keep_last;               /* prune: --keep-last N (-1: not given) */
  bool json;                    /* --json: one JSON document on stdout */

  /* Several disks at one instant (backup REPO --disk NAME -S C -u U
   * [--disk ...]): each --disk with the -S and -u that follow it.  One
   * --disk without its own -S/-u takes the global ones.
   */
  struct backup_disk *disks;
  size_t ndisks;
  const char *disk;             /* the first --disk (serve, restore...) */
  const char *pre_snapshot;     /* --pre-snapshot CMD */
  const char *post_snapshot;    /* --post-snapshot CMD */
  uint64_t limit_rate;          /* --limit-rate: bytes/s, 0: none */

  /* serve */
  const char *serve_socket;     /* -U SOCKET */
  const char *tcp_port;         /* --tcp PORT */
  const char *tls;              /* --tls=on|require|off */
  const char *tls_psk;          /* --tls-psk=FILE */
  const char *tls_certificates; /* --tls-certificates=DIR */
  bool writable;                /* --writable */

  /* The session with the server (snapfg-backup-session.c), open while a
   * command that talks to it runs.
   */
  struct backup_session *session;
};

/* One disk of a backup of several (--disk NAME -S CONTROL -u URI). */
struct backup_disk {
  const char *name;
  const char *socket;
  const char *uri;
};

/* The commands; each returns an exit status. */
extern int cmd_backup (const struct backup_options *o, const char *dir_path);
extern int cmd_restore (const struct backup_options *o, const char *dir_path,
                        const char *out);
extern int cmd_verify (const struct backup_options *o, const char *dir_path);
extern int cmd_list (const struct backup_options *o, const char *dir_path);
extern int cmd_prune (const struct backup_options *o, const char *dir_path);
/* One run in phases (snapfg-backup-run.c): every disk's run prepared
 * (its directory, kind, server, connection), then the snapshot taken,
 * then the run completed (copy, record).  Each returns an exit status;
 * run_end cleans up (on failure: the snapshot and checkpoint dropped)
 * and frees.
 */
struct run;
extern struct run *run_new (const struct backup_options *o,
                            const char *dir_path);
extern int run_prepare (struct run *r);
extern int run_snapshot (struct run *r);
extern int run_complete (struct run *r, const char *group, json_t *info);
extern void run_end (struct run *r, bool ok);

/* --- several disks at one instant (snapfg-backup-group.c) --- */

/* A run of one disk, as a backup of several disks at one instant (or
 * one disk with hooks) drives it: the group opens each disk's session,
 * prepares every run, holds the servers' writes, takes every snapshot,
 * resumes them, then completes each run, or ends them all (rolled
 * back) if anything before failed.  Two kinds: a qcow2 chain's
 * (backup_chain_kind, snapfg-backup-run.c) and a repository's
 * (repo_run_kind, snapfg-backup-repo-run.c).  The int functions return
 * an exit status.
 */
struct group_run_kind {
  /* A new run of disk NAME into REPO (SEVERAL: one of several disks),
   * talking to its server through O, whose session the group opens
   * (at where ()) before prepare.  Nothing is touched yet.  OPAQUE is
   * what the group was given for the kind.  NULL after a message.
   */
  void *(*new) (void *opaque, struct backup_options *o, const char *repo,
                const char *name, bool several);
  /* The session's directory (the checkpoints' owner, see session_open). */
  const char *(*where) (void *run);
  /* What can be refused before any server is asked (a repository's
   * key); NULL: nothing.
   */
  int (*open) (void *run);
  int (*prepare) (void *run);   /* everything before the snapshot */
  int (*snapshot) (void *run);  /* snapshot and checkpoint: the instant */
  /* The copy and the record, as part of GROUP, with INFO's members in
   * the record too.  Prints nothing on stdout when --json is given
   * (tool_out.json is false then: the group prints one document).
   */
  int (*complete) (void *run, const char *group, json_t *info);
  /* Clean up and free (not OK: the snapshot and checkpoint dropped,
   * nothing recorded that is not already).
   */
  void (*end) (void *run, bool ok);
  /* The run's number: a repository's is taken when its index is
   * written, before that the one it expects.
   */
  long (*seq) (void *run);
  const char *(*snapshot_name) (void *run);
  /* The run's record once complete (borrowed), else NULL. */
  json_t *(*record_json) (void *run);
  /* where () is a backup directory, shown as this member of --json and
   * in the hooks' SNAPFG_BACKUP_DIRS; NULL: not shown.
   */
  const char *where_member;
};
extern const struct group_run_kind backup_chain_kind;

/* The group: EXIT_OK or the exit status after a message. */
extern int backup_group (struct backup_options *o, const char *repo,
                         const struct group_run_kind *kind, void *opaque);
/* backup with several --disks, or with --pre-snapshot/--post-snapshot,
 * into a qcow2 backup directory.
 */
extern int cmd_backup_group (struct backup_options *o, const char *repo);

/* The command lines of backup (the qcow2 one, snapfg-backup-main.c, and
 * the repository's, snapfg-backup-repo-main.c) take the disks alike:
 * OPT is 'S', 'u' or 'd' (--disk ARG); after a --disk, -S and -u are
 * that disk's.  EXIT_OK, or EXIT_USAGE after a message.
 */
extern int backup_disk_option (struct backup_options *o, int opt,
                               const char *arg);
/* The disks as given, checked for command CMD: several only for
 * backup, each with its own -S and -u and none before; a single
 * --disk's -S and -u become the command's.  EXIT_OK, or EXIT_USAGE
 * after a message.
 */
extern int backup_disks_resolve (struct backup_options *o, const char *cmd);

/* serve (snapfg-backup-serve.c): becomes nbdkit; returns on failure. */
extern int cmd_serve (const struct backup_options *o, const char *repo);
/* Is LOCATION a repository (its config file, or s3://), not a qcow2
 * backup directory?
 */
extern bool backup_is_repository (const char *location);


/* Run ARGV (no shell) with stdout to /dev/null; in DIR if not NULL.
 * 0, or -1 after a message that names WHAT (the file or directory it
 * works on) and gives the program's own last message (out of space
 * said as such).
 */
extern int run_command (const char *dir, char *const argv[],
                        const char *what);

/* The line that ends a run (what it copied, how long it took, the rate)
 * and with --json its object on stdout.
 */
extern void backup_report_run (json_t *run, const char *dir_path,
                               double seconds);

/* A reply's member KEY as a number (0 when absent or not positive) or
 * as a string (NULL when absent or not a string).
 */
static inline uint64_t
json_u64 (json_t *obj, const char *key)
{
  json_int_t v = json_integer_value (json_object_get (obj, key));

  return v > 0 ? (uint64_t) v : 0;
}

static inline const char *
json_str (json_t *obj, const char *key)
{
  return json_string_value (json_object_get (obj, key));
}

/* --- the backup directory --- */

struct backup_dir {
  const char *path;
  int fd;
  int lock_fd;
};

/* Open DIR (creating it if asked, mode 0700; *created says whether it
 * was); 0, or -1 after a message.
 */
extern int open_backup_dir (const char *path, bool create,
                            struct backup_dir *d);
extern int open_backup_dir_created (const char *path, bool create,
                                    struct backup_dir *d, bool *created);
/* A directory the tool writes in must be its user's (or root's) and
 * writable by nobody else: a user who can write it could plant links
 * or swap files.  0, or -1 after a message that says how to fix it.
 */
extern int check_private_dir (struct backup_dir *d);
/* A name snapfg-backup writes, and the run number it carries. */
extern bool backup_file_name (const char *name, unsigned *seq, bool *partial);
/* Only one run at a time in a directory. */
extern int lock_backup_dir (struct backup_dir *d);
/* A directory without a manifest may start a chain only if it is empty
 * or holds only an interrupted first run's leftovers.
 */
extern int check_new_dir (struct backup_dir *d);
/* Remove what interrupted runs left, finish a rename a crash cut short;
 * LAST is the manifest's last run (NULL: none).
 */
extern int clean_leftovers (struct backup_dir *d, json_t *last);

/* The checkpoints on the server that no run needs, dropped: this
 * chain's but the last run's and the latest full's, and those of other
 * chains whose directory (their owner, on this host) is gone or holds
 * another chain now.  Returns the names dropped (a JSON array); says
 * each one unless --json (this chain's own only with TELL_OWN).
 */
extern json_t *drop_unneeded_checkpoints (const struct backup_options *o,
                                          json_t *manifest, bool tell_own);

/* --- the session with the server (snapfg-backup-session.c) --- */

struct backup_session {
  struct control_client ctl;
  char *data_uri;               /* the NBD URI to connect to from here */
  char *data_what;              /* the NBD server in messages: -u's URI,
                                   or with -H the socket or address on
                                   HOST that ssh forwards to */
  char *tmpdir;                 /* -H: the forwarded socket's directory */
  char *owner;                  /* "HOST:DIR", the checkpoints' owner */
};

/* Open the control connection (the socket, or ssh HOST snapfgctl
 * --stdio with the NBD socket forwarded) and check that the server
 * answers.  Returns 0, or the exit status after a message.
 */
extern int session_open (struct backup_options *o, const char *dir_path);
extern void session_close (struct backup_options *o);

/* Split -H [USER@]HOST[:PORT] ([IPV6]:PORT too) into what ssh takes:
 * DEST and PORT (NULL: ssh's default).  -1 if it is not that.
 */
extern int ssh_parse_host (const char *spec, char **dest, char **port);

/* --- one ssh connection for several disks (snapfg-backup-ssh-master.c) */

struct ssh_master {
  pid_t pid;                    /* ssh -N -o ControlMaster=yes */
  char *dir;                    /* private directory of its socket */
  char *path;                   /* its control socket */
  char *option;                 /* "ControlPath=PATH", for the sessions */
};

/* Connect and log in to -H's host once (o's --ssh-option, -p, BatchMode):
 * returns EXIT_OK when the master's control socket is ready, or the
 * exit status after a message naming the host and ssh's own reason.
 */
extern int ssh_master_start (const struct backup_options *o,
                             struct ssh_master *m);
/* Stop it (every session over it closed first); safe on a failed start. */
extern void ssh_master_stop (struct ssh_master *m);

/* --- control requests (snapfg-backup-control.c) --- */

/* Send REQ (not consumed) through the session and read the reply.
 * Returns the reply when it says "ok": true; otherwise NULL with the
 * server's message (or what went wrong talking to it) in err.
 */
extern json_t *control_call (const struct backup_options *o, json_t *req,
                             char *err, size_t err_len);
/* control_call in two halves: the server works on REQ while the caller
 * does something else.  control_send returns 0, or -1 with what went
 * wrong in err; control_receive then reads the reply to the request CMD
 * names, as control_call returns it.  No other request may be sent
 * between the two.
 */
extern int control_send (const struct backup_options *o, json_t *req,
                         char *err, size_t err_len);
extern json_t *control_receive (const struct backup_options *o,
                                const char *cmd, char *err, size_t err_len);
/* The exit status for the last control_call that failed: unreachable,
 * timed out, or refused (EXIT_FAILED).
 */
extern int control_failure_status (const struct backup_options *o);

/* --- NBD connections --- */

struct copy_range {
  uint64_t offset, length;
};

struct nbd_handle;
/* Connect to the server named by URI and stop in option mode, before an
 * export is chosen; open_export then finishes negotiating EXPORT.
 * connect_export does both.  All print a message when they fail, naming
 * the server as WHAT says (NULL: the URI).
 */
extern struct nbd_handle *connect_server (const char *uri, const char *what,
                                          bool want_extents);
extern int open_export (struct nbd_handle *h, const char *what,
                        const char *export);
extern struct nbd_handle *connect_export (const char *uri, const char *what,
                                          const char *export);
/* Up to N connections to EXPORT at once, stored packed from OUT;
 * returns how many were made (each failure printed).
 */
extern size_t connect_exports (const char *uri, const char *what,
                               const char *export, struct nbd_handle **out,
                               size_t n);
/* Close H (NULL is fine), however far it got. */
extern void disconnect (struct nbd_handle *h);
/* Close the N handles of H, not waiting for the server where nothing
 * is in flight.
 */
extern void disconnect_all (struct nbd_handle **h, size_t n);
/* A local image through qemu-nbd, started by socket activation. */
extern struct nbd_handle *open_image (const char *path, const char *format,
                                      bool readonly);
/* The ranges of H that may hold data, rounded out to BLOCK (malloc'd). */
extern int data_ranges (struct nbd_handle *h, uint64_t size, uint64_t block,
                        struct copy_range **out, size_t *nout);
/* Sort and merge ranges, rounding each out to BLOCK; the new count. */
extern size_t normalise_ranges (struct copy_range *r, size_t n,
                                uint64_t block, uint64_t size);

/* --- copy engine --- */

/* Where a new plain full image keeps each guest offset, read back from
 * the image qemu-img made with preallocation=metadata (direct.c).
 */
struct direct_map {
  int fd;                       /* the image file, open for writing */
  uint64_t span;                /* guest bytes per L2 table */
  size_t tables;
  uint64_t *base;               /* file offset - guest offset, per table */
  /* The writeback window: written since its writeback was started,
   * and the file range that went to (several threads write at once).
   */
  pthread_mutex_t lock;
  uint64_t pending, lo, hi;
};

/* 0 with M filled if the image in FD (of SIZE) has every cluster
 * allocated and laid out as expected; -1 otherwise (write it through
 * qemu-nbd then).
 */
extern int direct_map_read (int fd, uint64_t size, struct direct_map *m);
extern int direct_pwrite (struct direct_map *m, const char *buf,
                          uint64_t len, uint64_t off);
extern void direct_map_free (struct direct_map *m);

#define COPY_MAX_HEADROOM 4096

struct copy_job {
  struct nbd_handle **src;      /* connections to the snapshot */
  size_t nsrc;
  struct nbd_handle *dst;       /* the image being written; NULL: verify */
  struct direct_map *direct;    /* or the image's file, written
                                      directly (a new plain full) */
  const struct copy_range *ranges; /* sorted, disjoint, block aligned */
  size_t nranges;
  uint64_t size;                /* disk size (the last block may be short) */
  uint64_t block;               /* checksum block size, a power of two */
  unsigned char *sums;          /* SHA256_LEN per block; updated */
  bool write_zeroes;            /* all-zero blocks: write zeroes (an
                                   overlay) rather than skip (a new image) */
  const char *what;             /* for the progress line and errors */
  unsigned slots;               /* requests in flight (0: the default) */
  uint64_t piece;               /* bytes per piece (0: the default) */
  uint64_t request;             /* bytes per NBD read, at most (0: a
                                   piece in one read) */
  uint64_t stop_after;          /* test hook: stop after this many bytes */
  /* Or, with neither dst nor direct, each piece once hashed goes to
   * sink, in a pool thread (a repository's chunks: several at once):
   * 0 and *stored what it wrote, or an errno after a message.
   */
  int (*sink) (struct copy_job *job, uint64_t offset, const char *buf,
               uint64_t len, const bool *zero, size_t nblocks,
               uint64_t *stored);
  void *sink_opaque;
  /* Bytes the sink may write just before each piece's data (at most
   * COPY_MAX_HEADROOM), placed so that the piece's data minus them is
   * 4096-byte aligned: a repository puts a chunk's header there and
   * writes header and data from one aligned buffer, past the page cache.
   */
  size_t headroom;
  unsigned threads;             /* the pool's threads (0: the default) */
  uint64_t rate;                /* --limit-rate: bytes read per second at
                                   most (a token bucket); 0: no limit */

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

/* New sums for a disk of SIZE that reads as zero everywhere (the copy
 * skips holes): malloc'd, NULL when out of memory.
 */
extern unsigned char *sums_new_zero (uint64_t block, uint64_t size);

/* fsync a directory; fsync the file NAME in DIRFD (AT_FDCWD: a path).
 * Both keep errno for the caller's message.
 */
extern int fsync_dir (int dirfd);
extern int fsync_file (int dirfd, const char *name);

/* --- images (snapfg-backup-image.c) --- */

#define KEY_SECRET_ID "snapfg-backup-key"

/* How a run's images are written and read. */
struct image_access {
  const char *key_file;         /* the images are LUKS-encrypted: the key */
  const char *compress;         /* writes as compressed clusters: zstd,
                                   zlib; NULL: plain */
};

/* Create NAME in DIRFD exclusively (create_in_dir), then have qemu-img
 * write a qcow2 image of SIZE into that very file (through
 * /proc/self/fd/N, so no name in the directory is followed), over
 * BACKING (a name relative to the directory, or NULL).  Checks that the
 * name still is the file created.  0, or -1 after a message.  With
 * KEEP_FD, the image is made with preallocation=metadata (every cluster
 * placed, the file sparse) and *KEEP_FD is the file, open for writing
 * (direct_map_read).
 */
extern int image_create (int dirfd, const char *dir, const char *name,
                         uint64_t size, const char *backing,
                         const struct image_access *a, int *keep_fd);
/* Open DIR/NAME, a qcow2 image over DEPTH - 1 backing images, through
 * qemu-nbd (read-only, or writable with A's compression).
 */
/* The qemu-nbd command line that image_open runs (the serve command
 * hands it to nbdkit's nbd plugin): argv points into the struct.
 */
struct qemu_nbd_args {
  char *argv[12];
  char path[PATH_MAX];
  char opts[PATH_MAX * 2 + 4096];
  char secret[PATH_MAX * 2 + 64];
};
extern void image_qemu_nbd_args (const char *dir, const char *name,
                                 size_t depth, const struct image_access *a,
                                 bool readonly, struct qemu_nbd_args *q);
extern struct nbd_handle *image_open (const char *dir, const char *name,
                                      size_t depth,
                                      const struct image_access *a,
                                      bool readonly);
/* A new file OUT for restore: created exclusively; for qcow2 made an
 * empty image of SIZE, for raw truncated to SIZE; then opened through
 * qemu-nbd.  *fd is the file (fsync and rename it), *tmp its name.
 */
extern struct nbd_handle *output_open (const char *tmp, const char *format,
                                       uint64_t size, int *fd);

/* The images run RUN reads, from its own to the full one, checked
 * against the manifest before anything reads them: each name is the one
 * the manifest records, a regular file (not a link), a qcow2 image of
 * the run's size whose backing name is the manifest's, no name twice,
 * no external data file.  Returns the depth (>= 1) and the names in
 * *chain (NULL-terminated, the run's own first; chain_free; the first
 * may be NAME.partial, see the order of a run), or -1 after a message
 * naming the run and the file.
 */
extern int chain_check (int dirfd, const char *dir, json_t *manifest,
                        json_t *run, char ***chain);
extern void chain_free (char **chain);

/* The manifest's run SEQ (NULL if none). */
extern json_t *manifest_run (json_t *manifest, uint64_t seq);
/* The run's image (the one restore reads): empty runs name their
 * predecessor's.
 */
static inline const char *
run_image (json_t *run)
{
  return json_string_value (json_object_get (run, "image"));
}

/* Read RUN's sums and check them against its disk_sha256: the sums,
 * or NULL with the reason in err (naming the run and the file).
 */
extern unsigned char *run_sums (int dirfd, const char *dir, json_t *run,
                                char *err, size_t err_len);
/* Read H (RUN's disk) and compare every block with EXPECTED; 0 when it
 * matches, -1 after a message.  WHAT names the pass (progress line),
 * LABEL the disk in the message ("the restored disk").
 */
extern int verify_disk (struct nbd_handle *h, json_t *run,
                        const unsigned char *expected, const char *what,
                        const char *label);
/* Compare sums GOT with EXPECTED (RUN's): 0, or -1 after a message
 * naming the first block that differs.
 */
extern int sums_compare (const unsigned char *got,
                         const unsigned char *expected, json_t *run,
                         const char *label);
/* The run's image access (key when encrypted), or -1 after a message
 * when the run is encrypted and no --key-file was given.
 */
extern int run_access (const struct backup_options *o, json_t *run,
                       struct image_access *a);
/* Does A's key open DIR/NAME (an image of an encrypted chain)?  0, or
 * -1 after a message: checked before a run takes its snapshot.
 */
extern int image_key_check (const char *dir, const char *name,
                            const struct image_access *a);
/* --key-file F as main checks it for every command: F can be opened
 * and is a regular file (0), or -1 after a message; a key that others
 * may read is used, with a warning.
 */
extern int key_file_check (const char *path);
/* A run that is encrypted needs --key-file: EXIT_OK, or EXIT_USAGE
 * after a message (the same status from every command).
 */
extern int key_status (const struct backup_options *o, json_t *run);
/* The checkpoint a next --diff starts from, kept on the server while
 * the chain has differentials after its latest full (NULL: none).
 */
extern const char *diff_checkpoint_to_keep (json_t *runs);
/* Wait while SNAPFG_BACKUP_TEST_PAUSE names POINT, until the file
 * $SNAPFG_BACKUP_TEST_RESUME exists (tests only).
 */
extern void test_pause (const char *point);

#endif
