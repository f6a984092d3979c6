/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: full and incremental backups of a snapfg origin.
 *
 *   snapfg-backup -S CONTROL -u NBD_URI backup DIR [--full]
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
 *   5. the older checkpoint is dropped.
 * Anything of a run that is not in the manifest is a leftover: the next
 * run removes it (files, snapshots and checkpoints carrying this
 * directory's chain id).
 *
 * This file holds only the command line (main); the commands are in
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

#include "snapfg-backup.h"
#include "snapfg-backup-repo.h"
#include "cleanup.h"

/* Each command's synopsis: in --help and in its usage error. */
#define BACKUP_SYNOPSIS "snapfg-backup -S CONTROL -u NBD_URI backup DIR [--full | --diff] [--compress[=zstd|zlib]] [--encrypt] [--key-file F]"
#define REMOTE_SYNOPSIS "snapfg-backup -H [USER@]HOST[:PORT] -S CONTROL -u NBD_URI backup DIR [...]"
#define RESTORE_SYNOPSIS "snapfg-backup restore DIR OUT|- [--at N] [-O raw|qcow2] [--key-file F] [--no-verify]"
#define VERIFY_SYNOPSIS "snapfg-backup verify DIR [--at N | --all] [--key-file F] [--json]"
#define LIST_SYNOPSIS "snapfg-backup list DIR [--json]"
#define PRUNE_SYNOPSIS "snapfg-backup [-S CONTROL] prune DIR --keep-last N [--key-file F] [--json]"

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
           "\n"
           "A repository (deduplicated, compressed, encrypted chunks; every run\n"
           "a full point; REPO a directory or s3://BUCKET[/PREFIX]):\n"
           "       snapfg-backup init REPO [--encrypt --key-file F]\n"
           "       snapfg-backup [-H ...] -S CONTROL -u NBD_URI backup REPO --disk NAME\n"
           "                     [--full] [--key-file F] [--compress]\n"
           "       snapfg-backup restore REPO OUT --disk NAME [--at N] [--key-file F]\n"
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
           "  -h, --help, -V, --version\n"
           "\n"
           "Exit status: 0 done, 1 failed, 2 usage error, 3 an incremental\n"
           "is impossible (run with --full), 4 the server cannot be reached,\n"
           "5 the server did not reply in time (--timeout, default %d s).\n",
           TOOL_DEFAULT_TIMEOUT);
}

/* A command given the wrong number of operands, or an option that is
 * not its own: say how it is used.
 */
static bool
wrong_usage (bool wrong, const char *synopsis)
{
  if (wrong)
    fprintf (stderr, "snapfg-backup: usage: %s\n", synopsis);
  return wrong;
}

int
main (int argc, char *argv[])
{
  enum { OPT_FULL = 256, OPT_AT, OPT_COW_DIR, OPT_NO_VERIFY, OPT_DIFF,
         OPT_COMPRESS, OPT_ENCRYPT, OPT_KEY_FILE, OPT_ALL, OPT_KEEP_LAST,
         OPT_JSON, OPT_SSH_OPTION, OPT_REMOTE_SNAPFGCTL, OPT_PROGRESS,
         OPT_TIMEOUT };
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
    { "help", no_argument, NULL, 'h' },
    { "version", no_argument, NULL, 'V' },
    { NULL, 0, NULL, 0 },
  };
  struct backup_options o = { .at = -1, .format = NULL, .keep_last = -1,
                              .remote_snapfgctl = "snapfgctl",
                              .timeout = TOOL_DEFAULT_TIMEOUT };
  struct sigaction sa = { .sa_handler = on_signal };
  const char *cmd;
  int c, status;

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
  o.ssh_options = ssh_options;
  if (o.ssh_options == NULL) {
    perror ("snapfg-backup");
    return EXIT_FAILED;
  }
  while ((c = getopt_long (argc, argv, "S:u:O:H:hV", long_options, NULL))
         != -1) {
    switch (c) {
    case 'S': o.socket = optarg; break;
    case 'u': o.uri = optarg; break;
    case 'O': o.format = optarg; break;
    case OPT_FULL: o.full = true; break;
    case OPT_COW_DIR: o.cow_dir = optarg; break;
    case OPT_NO_VERIFY: o.no_verify = true; break;
    case OPT_DIFF: o.diff = true; break;
    case OPT_ENCRYPT: o.encrypt = true; break;
    case OPT_KEY_FILE: o.key_file = optarg; break;
    case OPT_ALL: o.all = true; break;
    case OPT_JSON: o.json = tool_out.json = true; break;
    case 'H': o.host = optarg; break;
    case OPT_SSH_OPTION: o.ssh_options[o.nssh_options++] = optarg; break;
    case OPT_REMOTE_SNAPFGCTL: o.remote_snapfgctl = optarg; break;
    case OPT_PROGRESS:
      if (tool_parse_progress (optarg, &tool_out.progress) == -1) {
        fprintf (stderr, "snapfg-backup: --progress=%s: auto, always or "
                 "never\n", optarg);
        return EXIT_USAGE;
      }
      break;
    case OPT_TIMEOUT:
      if (tool_parse_timeout (optarg, 1, &o.timeout) == -1) {
        fprintf (stderr, "snapfg-backup: --timeout: not a number of seconds "
                 "(1 to %d): %s\n", TOOL_MAX_TIMEOUT, optarg);
        return EXIT_USAGE;
      }
      break;
    case OPT_COMPRESS:
      o.compress = optarg ? optarg : "zstd";
      if (strcmp (o.compress, "zstd") != 0 && strcmp (o.compress, "zlib") != 0) {
        fprintf (stderr, "snapfg-backup: --compress=%s: zstd or zlib\n",
                 o.compress);
        return EXIT_USAGE;
      }
      break;
    case OPT_KEEP_LAST: {
      char *end;
      errno = 0;
      o.keep_last = strtol (optarg, &end, 10);
      if (errno || end == optarg || *end || o.keep_last < 1) {
        fprintf (stderr, "snapfg-backup: --keep-last: not a number of runs "
                 "(1 or more): %s\n", optarg);
        return EXIT_USAGE;
      }
      break;
    }
    case OPT_AT: {
      char *end;
      errno = 0;
      o.at = strtol (optarg, &end, 10);
      if (errno || end == optarg || *end || o.at < 1) {
        fprintf (stderr, "snapfg-backup: --at: not a run number: %s\n",
                 optarg);
        return EXIT_USAGE;
      }
      break;
    }
    case 'h': usage (stdout); return EXIT_OK;
    case 'V': printf ("snapfg-backup %s\n", PACKAGE_VERSION); return EXIT_OK;
    default: usage (stderr); return EXIT_USAGE;
    }
  }
  if (optind >= argc) {
    usage (stderr);
    return EXIT_USAGE;
  }
  cmd = argv[optind++];

  sigemptyset (&sa.sa_mask);
  sigaction (SIGINT, &sa, NULL);
  sigaction (SIGTERM, &sa, NULL);
  signal (SIGPIPE, SIG_IGN);

  if (strcmp (cmd, "backup") == 0) {
    if (wrong_usage (argc - optind != 1 || o.at >= 0 || o.format ||
                     o.no_verify || o.all || o.keep_last >= 0 ||
                     (o.full && o.diff), BACKUP_SYNOPSIS))
      return EXIT_USAGE;
    if (o.socket == NULL || o.uri == NULL) {
      fprintf (stderr, "snapfg-backup: backup: give the server's control "
               "socket with -S CONTROL and its NBD URI with -u NBD_URI\n");
      return EXIT_USAGE;
    }
    if (o.host && o.cow_dir) {
      /* Its stores are files of the server's machine: this one cannot
       * remove them after a run.
       */
      fprintf (stderr, "snapfg-backup: --cow-dir is for a backup on the "
               "server's machine, not with -H\n");
      return EXIT_USAGE;
    }
    status = session_open (&o, argv[optind]);
    if (status == EXIT_OK)
      status = cmd_backup (&o, argv[optind]);
    session_close (&o);
    goto out;
  }
  if (o.host && strcmp (cmd, "prune") != 0) {
    fprintf (stderr, "snapfg-backup: %s: -H is for backup and prune\n", cmd);
    return EXIT_USAGE;
  }
  if (o.host == NULL && (o.nssh_options ||
                         strcmp (o.remote_snapfgctl, "snapfgctl") != 0)) {
    fprintf (stderr, "snapfg-backup: --ssh-option and --remote-snapfgctl "
             "need -H HOST\n");
    return EXIT_USAGE;
  }
  if (strcmp (cmd, "restore") == 0) {
    if (wrong_usage (argc - optind != 2 || o.full || o.cow_dir || o.diff ||
                     o.compress || o.encrypt || o.all || o.keep_last >= 0,
                     RESTORE_SYNOPSIS))
      return EXIT_USAGE;
    if (o.format == NULL)
      o.format = "raw";
    if (strcmp (o.format, "raw") != 0 && strcmp (o.format, "qcow2") != 0) {
      fprintf (stderr, "snapfg-backup: -O %s: the output format is raw or "
               "qcow2\n", o.format);
      return EXIT_USAGE;
    }
    status = cmd_restore (&o, argv[optind], argv[optind + 1]);
    goto out;
  }
  if (strcmp (cmd, "verify") == 0 || strcmp (cmd, "list") == 0 ||
      strcmp (cmd, "prune") == 0) {
    bool verify = cmd[0] == 'v', list = cmd[0] == 'l';
    if (wrong_usage (argc - optind != 1 || o.full || o.cow_dir || o.diff ||
                     o.compress || o.encrypt || o.format || o.no_verify ||
                     (!verify && (o.at >= 0 || o.all)) ||
                     (verify && o.at >= 0 && o.all) ||
                     (list && o.key_file) ||
                     ((cmd[0] == 'p') != (o.keep_last >= 0)),
                     verify ? VERIFY_SYNOPSIS : list ? LIST_SYNOPSIS
                     : PRUNE_SYNOPSIS))
      return EXIT_USAGE;
    if (!verify && !list && o.socket) {
      /* prune drops the server's checkpoints through a session too
       * (with -H, over ssh).
       */
      status = session_open (&o, argv[optind]);
      if (status == EXIT_OK)
        status = cmd_prune (&o, argv[optind]);
      session_close (&o);
      goto out;
    }
    status = verify ? cmd_verify (&o, argv[optind])
         : list ? cmd_list (&o, argv[optind]) : cmd_prune (&o, argv[optind]);
    goto out;
  }
  fprintf (stderr, "snapfg-backup: unknown command '%s' (backup, restore, "
           "verify, list or prune; "
           "see snapfg-backup --help)\n", cmd);
  return EXIT_USAGE;

 out:
  /* With --json, stdout always has one object: the command's own, or
   * this one.
   */
  if (tool_out.json && !tool_out.result_printed)
    tool_json_result (json_pack ("{s:s}", "command", cmd), status);
  return status;
}
