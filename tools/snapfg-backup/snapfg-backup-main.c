/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: full and incremental backups of a snapfg origin.
 *
 *   snapfg-backup [-H HOST] -S CONTROL -u NBD_URI backup DIR [--full | --diff]
 *   snapfg-backup restore DIR OUT|- [--at N] [-O raw|qcow2] [--no-verify]
 *   snapfg-backup verify DIR [--at N | --all]
 *   snapfg-backup list DIR
 *   snapfg-backup [-S CONTROL] prune DIR --keep-last N
 *
 * A run takes a snapshot and a new checkpoint at one instant (control
 * "create" with "checkpoint"), copies the snapshot (full) or the ranges
 * changed since the previous run's checkpoint up to that instant
 * (incremental, control "changed" with "since" and "name") into a new
 * qcow2 image (an overlay of the previous one for an incremental),
 * drops the snapshot, records the run in DIR/manifest.json and drops the
 * older checkpoint.  See snapfg-backup(1).
 *
 * Order of a run, so that a crash anywhere leaves the chain as it was
 * and the next run correct:
 *   1. the image is written as NNNN-TYPE.qcow2.partial and fsync'd;
 *   2. NNNN.sums is written (tmp, fsync, rename);
 *   3. the manifest naming NNNN-TYPE.qcow2 is made durable;
 *   4. the .partial is renamed to its name (a next run or a restore
 *      finishes this rename if a crash came between 3 and 4);
 *   5. the checkpoints no run needs are dropped (the last run's and
 *      the latest full run's stay).
 * Anything of a run that is not in the manifest is a leftover: the next
 * run removes it (files, snapshots and checkpoints carrying this
 * directory's chain id).
 *
 * This file holds only the command line: the table of subcommands
 * (name, operands, synopsis, the options each refuses, how it runs), the
 * option parser and main, which parses, checks and dispatches.  The
 * commands are in
 * snapfg-backup-run.c (backup), snapfg-backup-restore.c (restore),
 * snapfg-backup-verify.c (verify, list) and snapfg-backup-prune.c
 * (prune), which never call back into this file; snapfg-backup.h lists
 * the rest.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <unistd.h>
#include <signal.h>
#include <sys/stat.h>

#include "snapfg-backup.h"
#include "snapfg-backup-repo.h"
#include "cleanup.h"

/* Each command's synopsis: in --help and in its usage error. */
#define BACKUP_SYNOPSIS "snapfg-backup -S CONTROL -u NBD_URI backup DIR [--full | --diff] [--compress[=zstd|zlib]] [--encrypt] [--key-file F]"
#define REMOTE_SYNOPSIS "snapfg-backup -H [USER@]HOST[:PORT] -S CONTROL -u NBD_URI backup DIR [--full | --diff] [--compress[=zstd|zlib]] [--encrypt] [--key-file F] [--ssh-option OPT]... [--remote-snapfgctl PATH]"
#define RESTORE_SYNOPSIS "snapfg-backup restore DIR OUT|- [--at N] [-O raw|qcow2] [--key-file F] [--no-verify]"
#define VERIFY_SYNOPSIS "snapfg-backup verify DIR [--at N | --all] [--key-file F] [--json]"
#define LIST_SYNOPSIS "snapfg-backup list DIR [--json]"
#define PRUNE_SYNOPSIS "snapfg-backup [-S CONTROL] prune DIR --keep-last N [--key-file F] [--json]"
#define GROUP_SYNOPSIS "snapfg-backup [-H [USER@]HOST[:PORT]] backup REPO --disk NAME -S CONTROL -u NBD_URI [--disk NAME -S CONTROL -u NBD_URI]... [--pre-snapshot CMD] [--post-snapshot CMD] [--limit-rate R] [--full]"
#define SERVE_SYNOPSIS "snapfg-backup serve REPO [--disk NAME] [--at N] -U SOCKET | --tcp PORT [--writable] [--tls=on|require] [--tls-psk=F | --tls-certificates=DIR] [--limit-rate R] [--key-file F]"

/* Set by the signal handler, which runs in whichever thread the signal
 * lands on (the image thread forwards it too): a lock-free atomic is
 * both async-signal-safe and ordered between threads.
 */
atomic_int backup_interrupted;

static void
on_signal (int sig)
{
  backup_interrupted = 1;
}

static void
usage (FILE *fp)
{
  fprintf (fp,
           "usage: " BACKUP_SYNOPSIS "\n"
           "       " REMOTE_SYNOPSIS "\n"
           "       " RESTORE_SYNOPSIS "\n"
           "       " VERIFY_SYNOPSIS "\n"
           "       " LIST_SYNOPSIS "\n"
           "       " PRUNE_SYNOPSIS "\n"
           "       " GROUP_SYNOPSIS "\n"
           "       " SERVE_SYNOPSIS "\n"
           "\n"
           "A repository (deduplicated, compressed, encrypted chunks; every run\n"
           "a full point; REPO a directory or s3://BUCKET[/PREFIX]):\n"
           "       snapfg-backup init REPO [--encrypt --key-file F]\n"
           "       snapfg-backup [-H ...] -S CONTROL -u NBD_URI backup REPO --disk NAME\n"
           "                     [--full] [--key-file F] [--compress] [--limit-rate R]\n"
           "                     [--pre-snapshot CMD] [--post-snapshot CMD]\n"
           "       snapfg-backup [-H ...] backup REPO --disk NAME -S CONTROL -u NBD_URI\n"
           "                     [--disk NAME -S CONTROL -u NBD_URI]... [the options above]\n"
           "       snapfg-backup restore REPO OUT --disk NAME [--at N] [--key-file F]\n"
           "                     [--limit-rate R]\n"
           "       snapfg-backup verify REPO [--disk NAME] [--at N | --all] [--key-file F]\n"
           "       snapfg-backup list REPO [--disk NAME] [--json]\n"
           "       snapfg-backup prune REPO [--disk NAME] --keep-last N [--keep-hourly N]\n"
           "                     [--keep-daily N] [--keep-weekly N] [--keep-monthly N]\n"
           "                     [--keep-yearly N] [--dry-run]\n"
           "       snapfg-backup gc REPO [--grace SECONDS] [--dry-run]\n"
           "\n"
           "  backup DIR       back up the server's origin into DIR: a full\n"
           "                   qcow2 image the first time, then incremental\n"
           "                   overlays of the ranges changed since the last run\n"
           "  restore DIR OUT  write the disk as it was at run N (default:\n"
           "                   the latest) to OUT, a new file (-: standard output)\n"
           "  verify DIR       read run N's chain (default the latest; --all: every\n"
           "                   run) and check every block against its sums\n"
           "  list DIR         the runs: type, start, duration, bytes, image size\n"
           "  prune DIR        keep the last N runs (--keep-last N): older ones are\n"
           "                   committed into the full image, checkpoints dropped\n"
           "  serve REPO       serve run N (default: the latest) as an NBD export\n"
           "                   until SIGTERM, read-only (--writable: writes go to\n"
           "                   an overlay thrown away at exit)\n"
           "\n"
           "  -S, --socket=CONTROL   the server's control socket (control=)\n"
           "  -u, --uri=NBD_URI      the server, e.g. nbd+unix:///?socket=S,\n"
           "                         nbd://host:port/, nbds://host/?tls-psk-file=F\n"
           "  -H, --host=[USER@]HOST[:PORT]  run from a backup host: the control\n"
           "                         requests and the data over one ssh connection\n"
           "                         (-S and -u as HOST sees them)\n"
           "  --ssh-option=OPT       give ssh -o OPT (repeatable)\n"
           "  --remote-snapfgctl=PATH  snapfgctl on HOST (default: snapfgctl)\n"
           "  --full                 a full backup even if DIR has a chain\n"
           "  --diff                 a differential: all changes since the last full\n"
           "  --compress[=zstd|zlib] write compressed qcow2 clusters (default zstd)\n"
           "  --encrypt              a new chain encrypted with LUKS (with --full)\n"
           "  --key-file=F           the encryption key (F's bytes)\n"
           "  --no-verify            restore even when the run cannot be verified\n"
           "  --all                  verify every run\n"
           "  --keep-last=N          prune: the number of runs to keep\n"
           "  --json                 one JSON document on stdout (every command)\n"
           "  --progress=auto|always|never  progress (auto: on a terminal)\n"
           "  --timeout=SECONDS      wait this long for each control reply\n"
           "  --cow-dir=DIR          the snapshot's COW store goes here, not in\n"
           "                         the server's state directory\n"
           "  --at=N                 restore run N (see DIR/manifest.json)\n"
           "  -O, --output-format=raw|qcow2   restore's format (default raw)\n"
           "  --disk=NAME            the disk: REPO/NAME for a backup directory; in\n"
           "                         backup, each --disk takes the -S and -u after it\n"
           "                         and all are taken at one instant\n"
           "  --pre-snapshot=CMD     run CMD (sh -c) before the servers hold writes\n"
           "  --post-snapshot=CMD    run CMD after they resume (also after a failure)\n"
           "  --limit-rate=R         at most R bytes/s (suffixes K, M, G: 1024-based)\n"
           "  -U, --unix=SOCKET      serve: the Unix socket to serve on\n"
           "  --tcp=PORT             serve: the TCP port to serve on\n"
           "  --writable             serve: take writes (into a throw-away overlay)\n"
           "  --tls=on|require, --tls-psk=F, --tls-certificates=DIR   serve: TLS,\n"
           "                         as nbdkit's options of the same names\n"
           "  -h, --help, -V, --version\n"
           "\n"
           "Exit status: 0 done, 1 failed, 2 usage error, 3 an incremental\n"
           "is impossible (run with --full), 4 the server cannot be reached,\n"
           "5 the server did not reply in time (--timeout, default %d s).\n",
           TOOL_DEFAULT_TIMEOUT);
}

/* A command line that is wrong as a whole: one line that says so and
 * where the rest is, not the whole usage (which would scroll the
 * message itself off a terminal).
 */
static int
usage_hint (void)
{
  tool_error ("try 'snapfg-backup --help'");
  return EXIT_USAGE;
}

/* --- the subcommands ------------------------------------------------- */

/* One subcommand: its name, operand count and synopsis (for its usage
 * error), which options it refuses, and how it runs.  A new subcommand
 * is one more row in the table below.
 */
struct subcommand {
  const char *name;
  int operands;                 /* the number of operands after NAME */
  const char *synopsis;
  bool with_host;               /* may run from a backup host (-H) */
  /* true when O has an option that is not this command's (or its
   * options conflict); NULL: it takes them all.
   */
  bool (*options_wrong) (const struct backup_options *o);
  /* More checks of the command line, with their own message: 0, or
   * the exit status; NULL: none.
   */
  int (*check) (struct backup_options *o, char **operands);
  int (*run) (struct backup_options *o, char **operands);
};

/* A command that talks to the server: open the session (the control
 * connection, over ssh with -H), run, close it.
 */
static int
with_session (struct backup_options *o, const char *dir,
              int (*cmd) (const struct backup_options *, const char *))
{
  int status = session_open (o, dir);

  if (status == EXIT_OK)
    status = cmd (o, dir);
  session_close (o);
  return status;
}

/* The options only serve has. */
static bool
serve_options_given (const struct backup_options *o)
{
  return o->serve_socket || o->tcp_port || o->tls || o->tls_psk ||
    o->tls_certificates || o->writable;
}

/* The options only backup has. */
static bool
hook_options_given (const struct backup_options *o)
{
  return o->pre_snapshot || o->post_snapshot || o->ndisks > 1;
}

static bool
backup_options_wrong (const struct backup_options *o)
{
  return serve_options_given (o) || o->at >= 0 || o->format || o->no_verify || o->all ||
    o->keep_last >= 0 || (o->full && o->diff);
}

static int
backup_check (struct backup_options *o, char **operands)
{
  if (o->ndisks > 1)
    return o->cow_dir ? (fprintf (stderr, "snapfg-backup: --cow-dir is for "
                                  "a backup of one disk\n"), EXIT_USAGE)
      : EXIT_OK;
  if (o->socket == NULL || o->uri == NULL) {
    tool_error ("backup: give the server's control "
                "socket with -S CONTROL and its NBD URI with -u NBD_URI");
    return EXIT_USAGE;
  }
  if (o->host && o->cow_dir) {
    /* Its stores are files of the server's machine: this one cannot
     * remove them after a run.
     */
    tool_error ("--cow-dir is for a backup on the "
                "server's machine, not with -H");
    return EXIT_USAGE;
  }
  return EXIT_OK;
}

static int
backup_run (struct backup_options *o, char **operands)
{
  /* Several disks at one instant, or hooks around the snapshot: the
   * group (it opens a session per disk).
   */
  if (o->ndisks > 1 || o->pre_snapshot || o->post_snapshot)
    return cmd_backup_group (o, operands[0]);
  return with_session (o, operands[0], cmd_backup);
}

static bool
restore_options_wrong (const struct backup_options *o)
{
  return serve_options_given (o) || hook_options_given (o) || o->full || o->cow_dir || o->diff || o->compress || o->encrypt ||
    o->all || o->keep_last >= 0;
}

static int
restore_check (struct backup_options *o, char **operands)
{
  if (o->format == NULL)
    o->format = "raw";
  if (strcmp (o->format, "raw") != 0 && strcmp (o->format, "qcow2") != 0) {
    tool_error ("-O %s: the output format is raw or "
                "qcow2", o->format);
    return EXIT_USAGE;
  }
  return EXIT_OK;
}

static int
restore_run (struct backup_options *o, char **operands)
{
  return cmd_restore (o, operands[0], operands[1]);
}

/* The options backup and restore have and verify, list, prune not. */
static bool
reader_options_wrong (const struct backup_options *o)
{
  return serve_options_given (o) || hook_options_given (o) ||
    o->limit_rate || o->full || o->cow_dir || o->diff || o->compress || o->encrypt ||
    o->format || o->no_verify;
}

static bool
verify_options_wrong (const struct backup_options *o)
{
  return reader_options_wrong (o) || o->keep_last >= 0 ||
    (o->at >= 0 && o->all);
}

static int
verify_run (struct backup_options *o, char **operands)
{
  return cmd_verify (o, operands[0]);
}

static bool
list_options_wrong (const struct backup_options *o)
{
  return reader_options_wrong (o) || o->keep_last >= 0 || o->at >= 0 ||
    o->all || o->key_file;
}

static int
list_run (struct backup_options *o, char **operands)
{
  return cmd_list (o, operands[0]);
}

static bool
prune_options_wrong (const struct backup_options *o)
{
  return reader_options_wrong (o) || o->keep_last < 0 || o->at >= 0 ||
    o->all;
}

static int
prune_run (struct backup_options *o, char **operands)
{
  /* prune drops the server's checkpoints through a session too (with
   * -H, over ssh); without -S it only prunes the directory.
   */
  if (o->socket)
    return with_session (o, operands[0], cmd_prune);
  return cmd_prune (o, operands[0]);
}

static bool
serve_options_wrong (const struct backup_options *o)
{
  return hook_options_given (o) || o->full || o->cow_dir || o->diff ||
    o->compress || o->encrypt || o->format || o->no_verify || o->all ||
    o->keep_last >= 0 || o->socket || o->uri;
}

static int
serve_check (struct backup_options *o, char **operands)
{
  if ((o->serve_socket == NULL) == (o->tcp_port == NULL)) {
    fprintf (stderr, "snapfg-backup: serve: give where to serve, either "
             "-U SOCKET or --tcp PORT\n");
    return EXIT_USAGE;
  }
  if (o->tcp_port && strspn (o->tcp_port, "0123456789") !=
      strlen (o->tcp_port)) {
    fprintf (stderr, "snapfg-backup: --tcp %s: not a port number\n",
             o->tcp_port);
    return EXIT_USAGE;
  }
  if (o->tls && strcmp (o->tls, "on") != 0 && strcmp (o->tls, "require") != 0
      && strcmp (o->tls, "off") != 0) {
    fprintf (stderr, "snapfg-backup: --tls=%s: on, require or off\n", o->tls);
    return EXIT_USAGE;
  }
  if ((o->tls_psk || o->tls_certificates) && o->tls == NULL)
    o->tls = "require";
  return EXIT_OK;
}

static int
serve_run (struct backup_options *o, char **operands)
{
  return cmd_serve (o, operands[0]);
}

static const struct subcommand subcommands[] = {
  { "backup", 1, BACKUP_SYNOPSIS, true, backup_options_wrong, backup_check,
    backup_run },
  { "restore", 2, RESTORE_SYNOPSIS, false, restore_options_wrong,
    restore_check, restore_run },
  { "verify", 1, VERIFY_SYNOPSIS, false, verify_options_wrong, NULL,
    verify_run },
  { "list", 1, LIST_SYNOPSIS, false, list_options_wrong, NULL, list_run },
  { "prune", 1, PRUNE_SYNOPSIS, true, prune_options_wrong, NULL, prune_run },
  { "serve", 1, SERVE_SYNOPSIS, false, serve_options_wrong, serve_check,
    serve_run },
};
#define NR_SUBCOMMANDS (sizeof subcommands / sizeof subcommands[0])

/* "backup, restore, verify, list or prune", from the table. */
static const char *
subcommand_names (char *buf, size_t len)
{
  size_t used = 0;

  buf[0] = '\0';
  for (size_t i = 0; i < NR_SUBCOMMANDS && used < len; ++i)
    used += snprintf (buf + used, len - used, "%s%s",
                      i == 0 ? "" : i + 1 < NR_SUBCOMMANDS ? ", " : " or ",
                      subcommands[i].name);
  return buf;
}

static const struct subcommand *
find_subcommand (const char *name)
{
  size_t i;

  for (i = 0; i < NR_SUBCOMMANDS; i++)
    if (strcmp (subcommands[i].name, name) == 0)
      return &subcommands[i];
  return NULL;
}

/* --- the options ----------------------------------------------------- */

enum { OPT_FULL = 256, OPT_AT, OPT_COW_DIR, OPT_NO_VERIFY, OPT_DIFF,
       OPT_COMPRESS, OPT_ENCRYPT, OPT_KEY_FILE, OPT_ALL, OPT_KEEP_LAST,
       OPT_JSON, OPT_SSH_OPTION, OPT_REMOTE_SNAPFGCTL, OPT_PROGRESS,
       OPT_TIMEOUT, OPT_DISK, OPT_PRE_SNAPSHOT, OPT_POST_SNAPSHOT,
       OPT_LIMIT_RATE, OPT_TCP, OPT_TLS, OPT_TLS_PSK, OPT_TLS_CERTIFICATES,
       OPT_WRITABLE };

static const struct option long_options[] = {
  { "socket", required_argument, NULL, 'S' },
  { "uri", required_argument, NULL, 'u' },
  { "full", no_argument, NULL, OPT_FULL },
  { "at", required_argument, NULL, OPT_AT },
  { "output-format", required_argument, NULL, 'O' },
  { "cow-dir", required_argument, NULL, OPT_COW_DIR },
  { "no-verify", no_argument, NULL, OPT_NO_VERIFY },
  { "diff", no_argument, NULL, OPT_DIFF },
  { "compress", optional_argument, NULL, OPT_COMPRESS },
  { "encrypt", no_argument, NULL, OPT_ENCRYPT },
  { "key-file", required_argument, NULL, OPT_KEY_FILE },
  { "all", no_argument, NULL, OPT_ALL },
  { "keep-last", required_argument, NULL, OPT_KEEP_LAST },
  { "json", no_argument, NULL, OPT_JSON },
  { "host", required_argument, NULL, 'H' },
  { "ssh-option", required_argument, NULL, OPT_SSH_OPTION },
  { "remote-snapfgctl", required_argument, NULL, OPT_REMOTE_SNAPFGCTL },
  { "progress", required_argument, NULL, OPT_PROGRESS },
  { "timeout", required_argument, NULL, OPT_TIMEOUT },
  { "disk", required_argument, NULL, OPT_DISK },
  { "pre-snapshot", required_argument, NULL, OPT_PRE_SNAPSHOT },
  { "post-snapshot", required_argument, NULL, OPT_POST_SNAPSHOT },
  { "limit-rate", required_argument, NULL, OPT_LIMIT_RATE },
  { "unix", required_argument, NULL, 'U' },
  { "tcp", required_argument, NULL, OPT_TCP },
  { "tls", required_argument, NULL, OPT_TLS },
  { "tls-psk", required_argument, NULL, OPT_TLS_PSK },
  { "tls-certificates", required_argument, NULL, OPT_TLS_CERTIFICATES },
  { "writable", no_argument, NULL, OPT_WRITABLE },
  { "help", no_argument, NULL, 'h' },
  { "version", no_argument, NULL, 'V' },
  { NULL, 0, NULL, 0 },
};

/* WORD as a whole number >= 1 into *n: 0, or -1. */
static int
parse_count (const char *word, long *n)
{
  char *end;

  errno = 0;
  *n = strtol (word, &end, 10);
  return errno || end == word || *end || *n < 1 ? -1 : 0;
}

/* The options whose value must be checked: EXIT_OK, or EXIT_USAGE
 * after a message naming the value.
 */
static int
parse_valued_option (int c, struct backup_options *o)
{
  switch (c) {
  case OPT_PROGRESS:
    if (tool_parse_progress (optarg, &tool_out.progress) == 0)
      return EXIT_OK;
    tool_error ("--progress=%s: auto, always or never",
                optarg);
    return EXIT_USAGE;
  case OPT_TIMEOUT:
    if (tool_parse_timeout (optarg, 1, &o->timeout) == 0)
      return EXIT_OK;
    tool_error ("--timeout: not a number of seconds "
                "(1 to %d): %s", TOOL_MAX_TIMEOUT, optarg);
    return EXIT_USAGE;
  case OPT_COMPRESS:
    o->compress = optarg ? optarg : "zstd";
    if (strcmp (o->compress, "zstd") == 0 || strcmp (o->compress, "zlib") == 0)
      return EXIT_OK;
    tool_error ("--compress=%s: zstd or zlib",
                o->compress);
    return EXIT_USAGE;
  case OPT_KEEP_LAST:
    if (parse_count (optarg, &o->keep_last) == 0)
      return EXIT_OK;
    tool_error ("--keep-last: not a number of runs "
                "(1 or more): %s", optarg);
    return EXIT_USAGE;
  case OPT_AT:
    if (parse_count (optarg, &o->at) == 0)
      return EXIT_OK;
    tool_error ("--at: not a run number: %s", optarg);
    return EXIT_USAGE;
  case OPT_LIMIT_RATE:
    if (tool_parse_rate (optarg, &o->limit_rate) == 0)
      return EXIT_OK;
    fprintf (stderr, "snapfg-backup: --limit-rate: not a rate in bytes per "
             "second (a number, optionally with K, M or G; at least 1K): "
             "%s\n", optarg);
    return EXIT_USAGE;
  case OPT_DISK:
    if (*optarg && strchr (optarg, '/') == NULL && strcmp (optarg, ".") != 0
        && strcmp (optarg, "..") != 0) {
      return backup_disk_option (o, 'd', optarg);
    }
    fprintf (stderr, "snapfg-backup: --disk %s: a disk's name is a file "
             "name (no '/', not . or ..)\n", optarg);
    return EXIT_USAGE;
  }
  abort ();
}

/* Parse the options into O.  Returns -1 to go on with the command at
 * argv[optind], or the exit status (--help, --version, a usage error).
 */
static int
parse_options (int argc, char *argv[], struct backup_options *o)
{
  int c, status;

  while ((c = getopt_long (argc, argv, "S:u:O:H:U:hV", long_options, NULL))
         != -1) {
    switch (c) {
    /* After a --disk, -S and -u are that disk's. */
    case 'S': case 'u':
      status = backup_disk_option (o, c, optarg);
      if (status != EXIT_OK)
        return status;
      break;
    case 'U': o->serve_socket = optarg; break;
    case OPT_TCP: o->tcp_port = optarg; break;
    case OPT_TLS: o->tls = optarg; break;
    case OPT_TLS_PSK: o->tls_psk = optarg; break;
    case OPT_TLS_CERTIFICATES: o->tls_certificates = optarg; break;
    case OPT_WRITABLE: o->writable = true; break;
    case OPT_PRE_SNAPSHOT: o->pre_snapshot = optarg; break;
    case OPT_POST_SNAPSHOT: o->post_snapshot = optarg; break;
    case 'O': o->format = optarg; break;
    case OPT_FULL: o->full = true; break;
    case OPT_COW_DIR: o->cow_dir = optarg; break;
    case OPT_NO_VERIFY: o->no_verify = true; break;
    case OPT_DIFF: o->diff = true; break;
    case OPT_ENCRYPT: o->encrypt = true; break;
    case OPT_KEY_FILE: o->key_file = optarg; break;
    case OPT_ALL: o->all = true; break;
    case OPT_JSON: o->json = tool_out.json = true; break;
    case 'H': o->host = optarg; break;
    case OPT_SSH_OPTION: o->ssh_options[o->nssh_options++] = optarg; break;
    case OPT_REMOTE_SNAPFGCTL: o->remote_snapfgctl = optarg; break;
    case OPT_PROGRESS: case OPT_TIMEOUT: case OPT_COMPRESS:
    case OPT_KEEP_LAST: case OPT_AT: case OPT_LIMIT_RATE: case OPT_DISK:
      status = parse_valued_option (c, o);
      if (status != EXIT_OK)
        return status;
      break;
    case 'h': usage (stdout); return EXIT_OK;
    case 'V': printf ("snapfg-backup %s\n", PACKAGE_VERSION); return EXIT_OK;
    default: return usage_hint (); /* getopt named the option */
    }
  }
  return -1;
}

/* Is the command line right for SC, with NOPERANDS operands?  EXIT_OK,
 * or the exit status after a message.
 */
static int
check_command_line (const struct subcommand *sc, struct backup_options *o,
                    int noperands, char **operands)
{
  if (noperands != sc->operands ||
      (sc->options_wrong && sc->options_wrong (o))) {
    tool_error ("usage: %s", sc->synopsis);
    return EXIT_USAGE;
  }
  if (o->host && !sc->with_host) {
    tool_error ("%s: -H is not for this command (see snapfg-backup --help)",
                sc->name);
    return EXIT_USAGE;
  }
  if (o->host == NULL && (o->nssh_options ||
                          strcmp (o->remote_snapfgctl, "snapfgctl") != 0)) {
    tool_error ("--ssh-option and --remote-snapfgctl "
                "need -H HOST");
    return EXIT_USAGE;
  }
  if (o->key_file && key_file_check (o->key_file) == -1)
    return EXIT_USAGE;
  return sc->check ? sc->check (o, operands) : EXIT_OK;
}

/* --disk NAME with a qcow2 backup directory REPO: the disk's chain is
 * REPO/NAME (the layout a backup of several disks makes), and a single
 * --disk's -S and -u are the command's.  serve, and backup with several
 * --disks, look at the disks themselves.  EXIT_OK, or the exit status
 * after a message.
 */
static int
resolve_disk (const struct subcommand *sc, struct backup_options *o,
              char **operands, char **disk_dir)
{
  int status;

  if (o->ndisks == 0 || strcmp (sc->name, "serve") == 0)
    return EXIT_OK;
  status = backup_disks_resolve (o, sc->name);
  if (status != EXIT_OK || o->ndisks > 1)
    return status;
  if (backup_is_repository (operands[0]))
    return EXIT_OK;
  if (strcmp (sc->name, "backup") == 0 &&
      mkdir (operands[0], 0700) == -1 && errno != EEXIST) {
    fprintf (stderr, "snapfg-backup: %s: %m\n", operands[0]);
    return EXIT_FAILED;
  }
  if (asprintf (disk_dir, "%s/%s", operands[0], o->disks[0].name) == -1) {
    perror ("snapfg-backup");
    return EXIT_FAILED;
  }
  operands[0] = *disk_dir;
  return EXIT_OK;
}

int
main (int argc, char *argv[])
{
  struct backup_options o = { .at = -1, .format = NULL, .keep_last = -1,
                              .remote_snapfgctl = "snapfgctl",
                              .timeout = TOOL_DEFAULT_TIMEOUT };
  struct sigaction sa = { .sa_handler = on_signal };
  const struct subcommand *sc;
  const char *cmd;
  CLEANUP_FREE char *disk_dir = NULL;
  char names[256];
  int status;

  tool_out.prog = "snapfg-backup";
  /* A repository's commands (snapfg-backup-repo-main.c); -1: help,
   * version or a usage error, printed below.
   */
  sigemptyset (&sa.sa_mask);
  if (repo_command_line (argc, argv)) {
    sigaction (SIGINT, &sa, NULL);
    sigaction (SIGTERM, &sa, NULL);
    if ((status = repo_main (argc, argv)) >= 0)
      return status;
  }
  /* Freed on every way out of main, the early usage returns included. */
  CLEANUP_FREE char **ssh_options = calloc (argc + 1, sizeof *ssh_options);
  CLEANUP_FREE struct backup_disk *disks = calloc (argc + 1, sizeof *disks);
  o.ssh_options = ssh_options;
  o.disks = disks;
  if (o.ssh_options == NULL || o.disks == NULL) {
    tool_error ("out of memory");
    return EXIT_FAILED;
  }

  /* Parse the command line. */
  status = parse_options (argc, argv, &o);
  if (status != -1)
    return status;
  if (optind >= argc) {
    tool_error ("no command given (%s)",
                subcommand_names (names, sizeof names));
    return usage_hint ();
  }
  cmd = argv[optind++];
  sc = find_subcommand (cmd);
  if (sc == NULL) {
    tool_error ("unknown command '%s' (%s; see snapfg-backup --help)", cmd,
                subcommand_names (names, sizeof names));
    return EXIT_USAGE;
  }
  if (argc - optind == sc->operands) {
    status = resolve_disk (sc, &o, &argv[optind], &disk_dir);
    if (status != EXIT_OK)
      return status;
  }
  status = check_command_line (sc, &o, argc - optind, &argv[optind]);
  if (status != EXIT_OK)
    return status;

  /* Run it: a signal stops it cleanly. */
  sigemptyset (&sa.sa_mask);
  sigaction (SIGINT, &sa, NULL);
  sigaction (SIGTERM, &sa, NULL);
  signal (SIGPIPE, SIG_IGN);
  status = sc->run (&o, &argv[optind]);

  /* With --json, stdout always has one object: the command's own, or
   * this one.
   */
  if (tool_out.json && !tool_out.result_printed)
    tool_json_result (json_pack ("{s:s}", "command", cmd), status);
  return status;
}
