/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: full and incremental backups of a snapfg origin.
 *
 *   snapfg-backup -S CONTROL -u NBD_URI backup DIR [--full]
 *   snapfg-backup -H [USER@]HOST[:PORT] -S CONTROL -u NBD_URI backup DIR
 *   snapfg-backup restore DIR OUT [--at N] [-O raw|qcow2]
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
 * snapfg-backup-run.c (backup) and snapfg-backup-restore.c (restore),
 * which never call back into this file; snapfg-backup.h lists the rest.
 */

#include <config.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <unistd.h>

#include "snapfg-backup.h"

/* Each command's synopsis: in --help and in its usage error. */
#define BACKUP_SYNOPSIS "snapfg-backup -S CONTROL -u NBD_URI backup DIR [--full]"
#define REMOTE_SYNOPSIS "snapfg-backup -H [USER@]HOST[:PORT] -S CONTROL -u NBD_URI backup DIR [--full]"
#define RESTORE_SYNOPSIS "snapfg-backup restore DIR OUT [--at N] [-O raw|qcow2]"

volatile sig_atomic_t backup_interrupted;

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
           "\n"
           "  backup DIR       back up the server's origin into DIR: a full\n"
           "                   qcow2 image the first time, then incremental\n"
           "                   overlays of the ranges changed since the last run\n"
           "  restore DIR OUT  write the disk as it was at run N (default:\n"
           "                   the latest) to OUT, a new file\n"
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
           "  --cow-dir=DIR          the snapshot's COW store goes here, not in\n"
           "                         the server's state directory\n"
           "  --at=N                 restore run N (see DIR/manifest.json)\n"
           "  -O, --output-format=raw|qcow2   restore's format (default raw)\n"
           "  --json                 print one JSON object on stdout\n"
           "  --progress=auto|always|never  progress (auto: on a terminal)\n"
           "  --timeout=SECONDS      wait this long for each control reply\n"
           "                         (default %d)\n"
           "  -h, --help, -V, --version\n"
           "\n"
           "Exit status: 0 done, 1 failed, 2 usage error, 3 an incremental\n"
           "is impossible (run with --full), 4 the server cannot be reached,\n"
           "5 the server did not reply in time.\n", TOOL_DEFAULT_TIMEOUT);
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
  enum { OPT_FULL = 256, OPT_AT, OPT_COW_DIR, OPT_SSH_OPTION,
         OPT_REMOTE_SNAPFGCTL, OPT_JSON, OPT_PROGRESS, OPT_TIMEOUT };
  static const struct option long_options[] = {
    { "socket", required_argument, NULL, 'S' },
    { "uri", required_argument, NULL, 'u' },
    { "full", no_argument, NULL, OPT_FULL },
    { "at", required_argument, NULL, OPT_AT },
    { "output-format", required_argument, NULL, 'O' },
    { "cow-dir", required_argument, NULL, OPT_COW_DIR },
    { "host", required_argument, NULL, 'H' },
    { "ssh-option", required_argument, NULL, OPT_SSH_OPTION },
    { "remote-snapfgctl", required_argument, NULL, OPT_REMOTE_SNAPFGCTL },
    { "json", no_argument, NULL, OPT_JSON },
    { "progress", required_argument, NULL, OPT_PROGRESS },
    { "timeout", required_argument, NULL, OPT_TIMEOUT },
    { "help", no_argument, NULL, 'h' },
    { "version", no_argument, NULL, 'V' },
    { NULL, 0, NULL, 0 },
  };
  struct backup_options o = { .at = -1, .format = NULL,
                              .remote_snapfgctl = "snapfgctl",
                              .timeout = TOOL_DEFAULT_TIMEOUT };
  struct sigaction sa = { .sa_handler = on_signal };
  char cow_dir[PATH_MAX];
  const char *cmd;
  int c, status;

  tool_out.prog = "snapfg-backup";
  o.ssh_options = calloc (argc + 1, sizeof *o.ssh_options);
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
    case 'H': o.host = optarg; break;
    case OPT_SSH_OPTION: o.ssh_options[o.nssh_options++] = optarg; break;
    case OPT_REMOTE_SNAPFGCTL: o.remote_snapfgctl = optarg; break;
    case OPT_JSON: tool_out.json = true; break;
    case OPT_PROGRESS:
      if (tool_parse_progress (optarg, &tool_out.progress) == -1) {
        fprintf (stderr, "snapfg-backup: --progress=%s: auto, always or "
                 "never\n", optarg);
        return EXIT_USAGE;
      }
      break;
    case OPT_TIMEOUT: {
      char *end;
      long v;
      errno = 0;
      v = strtol (optarg, &end, 10);
      if (errno || end == optarg || *end || v < 1 || v > 86400) {
        fprintf (stderr, "snapfg-backup: --timeout: not a number of seconds "
                 "(1 to 86400): %s\n", optarg);
        return EXIT_USAGE;
      }
      o.timeout = v;
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
    if (wrong_usage (argc - optind != 1 || o.at >= 0 || o.format,
                     BACKUP_SYNOPSIS))
      return EXIT_USAGE;
    if (o.host && o.cow_dir) {
      /* Its stores are files of the server's machine: this one cannot
       * remove them after a run.
       */
      fprintf (stderr, "snapfg-backup: --cow-dir is for a backup on the "
               "server's machine, not with -H\n");
      return EXIT_USAGE;
    }
    if (o.host == NULL && (o.nssh_options ||
                           strcmp (o.remote_snapfgctl, "snapfgctl") != 0)) {
      fprintf (stderr, "snapfg-backup: --ssh-option and --remote-snapfgctl "
               "need -H HOST\n");
      return EXIT_USAGE;
    }
    if (o.socket == NULL || o.uri == NULL) {
      fprintf (stderr, "snapfg-backup: backup: give the server's control "
               "socket with -S CONTROL and its NBD URI with -u NBD_URI\n");
      return EXIT_USAGE;
    }
    if (o.cow_dir) {
      /* The server runs in "/": it needs an absolute path. */
      if (realpath (o.cow_dir, cow_dir) == NULL) {
        fprintf (stderr, "snapfg-backup: --cow-dir %s: %m\n", o.cow_dir);
        return EXIT_USAGE;
      }
      o.cow_dir = cow_dir;
    }
    status = session_open (&o, argv[optind]);
    if (status == EXIT_OK)
      status = cmd_backup (&o, argv[optind]);
    session_close (&o);
    goto out;
  }
  if (strcmp (cmd, "restore") == 0) {
    if (wrong_usage (argc - optind != 2 || o.full || o.cow_dir || o.host,
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
  fprintf (stderr, "snapfg-backup: unknown command '%s' (backup or restore; "
           "see snapfg-backup --help)\n", cmd);
  return EXIT_USAGE;

 out:
  /* With --json, stdout always has one object: the command's own, or
   * this one.
   */
  if (tool_out.json && !tool_out.result_printed)
    tool_json_result (json_pack ("{s:s}", "command", cmd), status);
  free (o.ssh_options);
  return status;
}
