/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: the command line of the repository commands.
 *
 *   snapfg-backup init REPO [--encrypt --key-file F]
 *   snapfg-backup [-H ...] -S CONTROL -u NBD_URI backup REPO --disk NAME
 *                 [--full] [--key-file F] [--compress] [--limit-rate R]
 *                 [--pre-snapshot CMD] [--post-snapshot CMD]
 *   snapfg-backup [-H ...] backup REPO --disk NAME -S CONTROL -u NBD_URI
 *                 [--disk NAME -S CONTROL -u NBD_URI]... [the same options]
 *   snapfg-backup restore REPO OUT --disk NAME [--at N] [--key-file F]
 *                 [--limit-rate R]
 *   snapfg-backup verify REPO [--disk NAME] [--at N | --all] [--key-file F]
 *   snapfg-backup list REPO [--disk NAME]
 *   snapfg-backup prune REPO [--disk NAME] --keep-last N [--keep-hourly N]
 *                 [--keep-daily N] [--keep-weekly N] [--keep-monthly N]
 *                 [--keep-yearly N] [--dry-run]
 *   snapfg-backup gc REPO [--grace SECONDS] [--dry-run]
 *
 * REPO is a directory or s3://BUCKET[/PREFIX].  main (snapfg-backup-
 * main.c) hands a command line here when repo_command_line says it is
 * one for a repository; the rest stays with the qcow2 chains.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>

#include "cleanup.h"
#include "snapfg-error.h"
#include "repo-s3-config.h"
#include "snapfg-backup-repo.h"

#define INIT_SYNOPSIS "snapfg-backup init REPO [--encrypt --key-file F] [--s3-endpoint URL] [--s3-credentials FILE]"
#define BACKUP_SYNOPSIS "snapfg-backup [-H [USER@]HOST[:PORT]] -S CONTROL -u NBD_URI backup REPO --disk NAME [--full] [--key-file F] [--compress] [--limit-rate R] [--pre-snapshot CMD] [--post-snapshot CMD]"
#define GROUP_SYNOPSIS "snapfg-backup [-H [USER@]HOST[:PORT]] backup REPO --disk NAME -S CONTROL -u NBD_URI [--disk NAME -S CONTROL -u NBD_URI]... [--full] [--key-file F] [--compress] [--limit-rate R] [--pre-snapshot CMD] [--post-snapshot CMD]"
#define RESTORE_SYNOPSIS "snapfg-backup restore REPO OUT --disk NAME [--at N] [--key-file F] [--limit-rate R]"
#define VERIFY_SYNOPSIS "snapfg-backup verify REPO [--disk NAME] [--at N | --all] [--key-file F]"
#define LIST_SYNOPSIS "snapfg-backup list REPO [--disk NAME] [--json]"
#define PRUNE_SYNOPSIS "snapfg-backup prune REPO [--disk NAME] --keep-last N [--keep-hourly N] [--keep-daily N] [--keep-weekly N] [--keep-monthly N] [--keep-yearly N] [--dry-run]"
#define GC_SYNOPSIS "snapfg-backup gc REPO [--grace SECONDS] [--dry-run]"

enum {
  OPT_FULL = 256, OPT_AT, OPT_COW_DIR, OPT_NO_VERIFY, OPT_DIFF, OPT_COMPRESS,
  OPT_ENCRYPT, OPT_KEY_FILE, OPT_ALL, OPT_KEEP_LAST, OPT_JSON,
  OPT_SSH_OPTION, OPT_REMOTE_SNAPFGCTL, OPT_PROGRESS, OPT_TIMEOUT,
  OPT_DISK, OPT_KEEP_HOURLY, OPT_KEEP_DAILY, OPT_KEEP_WEEKLY,
  OPT_KEEP_MONTHLY, OPT_KEEP_YEARLY, OPT_DRY_RUN, OPT_GRACE, OPT_THREADS,
  OPT_S3_ENDPOINT, OPT_S3_CREDENTIALS, OPT_PRE_SNAPSHOT, OPT_POST_SNAPSHOT,
  OPT_LIMIT_RATE,
};

/* Every option of both command lines, so that the operands are found
 * the same way whichever one it is.
 */
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
  { "keep-hourly", required_argument, NULL, OPT_KEEP_HOURLY },
  { "keep-daily", required_argument, NULL, OPT_KEEP_DAILY },
  { "keep-weekly", required_argument, NULL, OPT_KEEP_WEEKLY },
  { "keep-monthly", required_argument, NULL, OPT_KEEP_MONTHLY },
  { "keep-yearly", required_argument, NULL, OPT_KEEP_YEARLY },
  { "dry-run", no_argument, NULL, OPT_DRY_RUN },
  { "grace", required_argument, NULL, OPT_GRACE },
  { "threads", required_argument, NULL, OPT_THREADS },
  { "disk", required_argument, NULL, OPT_DISK },
  { "s3-endpoint", required_argument, NULL, OPT_S3_ENDPOINT },
  { "s3-credentials", required_argument, NULL, OPT_S3_CREDENTIALS },
  { "pre-snapshot", required_argument, NULL, OPT_PRE_SNAPSHOT },
  { "post-snapshot", required_argument, NULL, OPT_POST_SNAPSHOT },
  { "limit-rate", required_argument, NULL, OPT_LIMIT_RATE },
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
#define SHORT_OPTIONS "S:u:O:H:hV"

static bool
is_command (const char *cmd, const char *const *list)
{
  for (; *list; ++list)
    if (strcmp (cmd, *list) == 0)
      return true;
  return false;
}

bool
repo_command_line (int argc, char *argv[])
{
  static const char *const with_repo[] = { "backup", "restore", "verify",
                                           "list", "prune", NULL };
  CLEANUP_FREE char **args = calloc (argc + 1, sizeof *args);
  struct repo_s3_options s3 = { 0 };
  const char *cmd, *loc;
  bool want = false;
  int c, saved_opterr = opterr;

  if (args == NULL)
    return false;
  memcpy (args, argv, argc * sizeof *args);
  opterr = 0;
  optind = 0;
  while ((c = getopt_long (argc, args, SHORT_OPTIONS, long_options, NULL))
         != -1) {
    if (c == OPT_S3_ENDPOINT)
      s3.endpoint = optarg;
    else if (c == OPT_S3_CREDENTIALS)
      s3.credentials_file = optarg;
    /* Options only a repository has: its commands, even where REPO is
     * not one (so that the error says so).  (--disk is not one: with a
     * qcow2 backup directory it names the chain REPO/NAME, and backup
     * takes several at one instant, snapfg-backup-group.c.)
     */
    if (c == OPT_KEEP_HOURLY || c == OPT_KEEP_DAILY ||
        c == OPT_KEEP_WEEKLY || c == OPT_KEEP_MONTHLY ||
        c == OPT_KEEP_YEARLY || c == OPT_DRY_RUN || c == OPT_GRACE ||
        c == OPT_S3_ENDPOINT || c == OPT_S3_CREDENTIALS)
      want = true;
  }
  if (optind < argc) {
    cmd = args[optind];
    loc = optind + 1 < argc ? args[optind + 1] : NULL;
    if (strcmp (cmd, "init") == 0 || strcmp (cmd, "gc") == 0)
      want = true;
    else if (!is_command (cmd, with_repo))
      want = false;
    else if (is_command (cmd, with_repo) && loc)
      want = want || repo_location_is_s3 (loc) || repo_exists (loc, &s3) == 1;
  }
  opterr = saved_opterr;
  optind = 0;                   /* main parses again from the start */
  return want;
}

int
repo_fail (int err, const char *context)
{
  const char *msg = snapfg_get_error ();

  if (context)
    backup_error ("%s: %s", context, msg ? msg : strerror (err > 0 ? err
                                                            : -err));
  else
    backup_error ("%s", msg ? msg : strerror (err > 0 ? err : -err));
  if (err < 0)
    err = -err;
  return err == EINVAL && msg == NULL ? EXIT_USAGE : EXIT_FAILED;
}

int
repo_open_for (struct repo_options *o, const char *location, bool need_key,
               struct repo **r)
{
  int ret;

  snapfg_clear_error ();
  ret = repo_open (location, &o->s3, o->b.key_file, r);
  if (ret < 0)
    return repo_fail (ret, NULL);
  if (need_key && !repo_has_key (*r)) {
    backup_error ("%s: the repository is encrypted: give its key with "
                  "--key-file FILE", location);
    repo_close (*r);
    *r = NULL;
    return EXIT_USAGE;
  }
  return 0;
}

static int
cmd_init (struct repo_options *o, const char *location)
{
  json_t *config;
  int ret;

  snapfg_clear_error ();
  ret = repo_init (location, &o->s3, o->encrypt, o->b.key_file, &config);
  if (ret < 0) {
    int st = repo_fail (ret, NULL);
    return ret == -EINVAL && !o->encrypt != !o->b.key_file ? EXIT_USAGE : st;
  }
  if (o->b.json)
    tool_json_result (json_pack ("{s:s, s:s, s:s, s:b, s:i}",
                                 "command", "init",
                                 "repository", location,
                                 "id", json_string_value
                                 (json_object_get (config, "id")),
                                 "encrypted", o->encrypt,
                                 "chunk_size", (int) REPO_CHUNK_SIZE), 0);
  else
    printf ("snapfg-backup: initialised %s repository %s\n",
            o->encrypt ? "an encrypted" : "a", location);
  json_decref (config);
  return EXIT_OK;
}

static bool
wrong_usage (bool wrong, const char *synopsis)
{
  if (wrong)
    fprintf (stderr, "snapfg-backup: usage: %s\n", synopsis);
  return wrong;
}

static int
parse_count (const char *opt, const char *arg, long min, long *out)
{
  char *end;

  errno = 0;
  *out = strtol (arg, &end, 10);
  if (errno || end == arg || *end || *out < min) {
    fprintf (stderr, "snapfg-backup: %s: not a number (%ld or more): %s\n",
             opt, min, arg);
    return -1;
  }
  return 0;
}

int
repo_main (int argc, char *argv[])
{
  struct repo_options o = { .b = { .at = -1, .keep_last = -1,
                                   .remote_snapfgctl = "snapfgctl",
                                   .timeout = TOOL_DEFAULT_TIMEOUT },
                            .grace = -1 };
  CLEANUP_FREE char **ssh_options = calloc (argc + 1, sizeof *ssh_options);
  CLEANUP_FREE struct backup_disk *disks = calloc (argc + 1, sizeof *disks);
  bool other = false;           /* an option of the qcow2 chains only */
  const char *cmd, *loc;
  long v;
  int c, status, nops;

  if (ssh_options == NULL || disks == NULL) {
    perror ("snapfg-backup");
    return EXIT_FAILED;
  }
  o.b.ssh_options = ssh_options;
  o.b.disks = disks;
  optind = 0;
  while ((c = getopt_long (argc, argv, SHORT_OPTIONS, long_options, NULL))
         != -1) {
    switch (c) {
    /* After a --disk, -S and -u are that disk's. */
    case 'S': case 'u': case OPT_DISK:
      if (backup_disk_option (&o.b, c == OPT_DISK ? 'd' : c, optarg)
          != EXIT_OK)
        return EXIT_USAGE;
      break;
    case OPT_PRE_SNAPSHOT: o.b.pre_snapshot = optarg; break;
    case OPT_POST_SNAPSHOT: o.b.post_snapshot = optarg; break;
    case OPT_LIMIT_RATE:
      if (tool_parse_rate (optarg, &o.b.limit_rate) == -1) {
        fprintf (stderr, "snapfg-backup: --limit-rate: not a rate in bytes "
                 "per second (a number, optionally with K, M or G; at least "
                 "1K): %s\n", optarg);
        return EXIT_USAGE;
      }
      break;
    case 'H': o.b.host = optarg; break;
    case OPT_SSH_OPTION: o.b.ssh_options[o.b.nssh_options++] = optarg; break;
    case OPT_REMOTE_SNAPFGCTL: o.b.remote_snapfgctl = optarg; break;
    case OPT_FULL: o.b.full = true; break;
    case OPT_KEY_FILE: o.b.key_file = optarg; break;
    case OPT_ALL: o.b.all = true; break;
    case OPT_JSON: o.b.json = tool_out.json = true; break;
    case OPT_ENCRYPT: o.encrypt = true; break;
    case OPT_DRY_RUN: o.dry_run = true; break;
    case OPT_S3_ENDPOINT: o.s3.endpoint = optarg; break;
    case OPT_S3_CREDENTIALS: o.s3.credentials_file = optarg; break;
    case OPT_COMPRESS:
      if (optarg && strcmp (optarg, "zstd") != 0) {
        fprintf (stderr, "snapfg-backup: --compress=%s: a repository's "
                 "chunks are compressed with zstd\n", optarg);
        return EXIT_USAGE;
      }
      o.compress = true;
      break;
    case OPT_PROGRESS:
      if (tool_parse_progress (optarg, &tool_out.progress) == -1) {
        fprintf (stderr, "snapfg-backup: --progress=%s: auto, always or "
                 "never\n", optarg);
        return EXIT_USAGE;
      }
      break;
    case OPT_TIMEOUT:
      if (tool_parse_timeout (optarg, 1, &o.b.timeout) == -1) {
        fprintf (stderr, "snapfg-backup: --timeout: not a number of seconds "
                 "(1 to %d): %s\n", TOOL_MAX_TIMEOUT, optarg);
        return EXIT_USAGE;
      }
      break;
    case OPT_AT:
      if (parse_count ("--at", optarg, 1, &o.b.at) == -1)
        return EXIT_USAGE;
      break;
    case OPT_GRACE:
      if (parse_count ("--grace", optarg, 0, &v) == -1)
        return EXIT_USAGE;
      o.grace = v;
      break;
    case OPT_THREADS:
      if (parse_count ("--threads", optarg, 1, &v) == -1 || v > 8) {
        fprintf (stderr, "snapfg-backup: --threads: 1 to 8\n");
        return EXIT_USAGE;
      }
      o.threads = v;
      break;
    case OPT_KEEP_LAST: case OPT_KEEP_HOURLY: case OPT_KEEP_DAILY:
    case OPT_KEEP_WEEKLY: case OPT_KEEP_MONTHLY: case OPT_KEEP_YEARLY: {
      int k = c == OPT_KEEP_LAST ? REPO_KEEP_LAST
            : c == OPT_KEEP_HOURLY ? REPO_KEEP_HOURLY
            : c == OPT_KEEP_DAILY ? REPO_KEEP_DAILY
            : c == OPT_KEEP_WEEKLY ? REPO_KEEP_WEEKLY
            : c == OPT_KEEP_MONTHLY ? REPO_KEEP_MONTHLY : REPO_KEEP_YEARLY;
      char opt[32];
      snprintf (opt, sizeof opt, "--keep-%s", repo_keep_name (k));
      if (parse_count (opt, optarg, 0, &o.keep[k]) == -1)
        return EXIT_USAGE;
      o.keep_given = true;
      break;
    }
    case 'O': case OPT_COW_DIR: case OPT_NO_VERIFY: case OPT_DIFF:
      other = true;
      break;
    case 'h': case 'V': default:
      /* main prints these (help, version, an unknown option). */
      optind = 0;
      return -1;
    }
  }
  if (optind >= argc)
    return -1;
  cmd = argv[optind++];
  nops = argc - optind;
  loc = nops > 0 ? argv[optind] : NULL;
  /* Several --disks (backup only), or one with its -S and -u after it. */
  if ((status = backup_disks_resolve (&o.b, cmd)) != EXIT_OK)
    goto out;
  o.disk = o.b.disk;

  /* The S3 settings: options first, then the usual AWS variables
   * (the keys themselves are read by the back end when it opens).
   */
  repo_s3_options_from_env (&o.s3, o.s3.endpoint, o.s3.credentials_file);

  {
    struct sigaction sa = { .sa_handler = SIG_IGN };
    sigaction (SIGPIPE, &sa, NULL);
  }
  if (other) {
    fprintf (stderr, "snapfg-backup: %s: -O, --cow-dir, --no-verify and "
             "--diff are for a backup directory of qcow2 chains, not a "
             "repository\n", cmd);
    status = EXIT_USAGE;
    goto out;
  }
  if (o.b.host && strcmp (cmd, "backup") != 0) {
    fprintf (stderr, "snapfg-backup: %s: -H is for backup\n", cmd);
    status = EXIT_USAGE;
    goto out;
  }
  if (o.b.keep_last >= 0 || (o.keep_given && strcmp (cmd, "prune") != 0) ||
      (o.dry_run && strcmp (cmd, "prune") != 0 && strcmp (cmd, "gc") != 0) ||
      (o.grace >= 0 && strcmp (cmd, "gc") != 0) ||
      (o.encrypt && strcmp (cmd, "init") != 0) ||
      (o.compress && strcmp (cmd, "backup") != 0) ||
      (o.b.full && strcmp (cmd, "backup") != 0) ||
      ((o.b.pre_snapshot || o.b.post_snapshot) &&
       strcmp (cmd, "backup") != 0) ||
      (o.b.limit_rate && strcmp (cmd, "backup") != 0 &&
       strcmp (cmd, "restore") != 0) ||
      ((o.b.socket || o.b.uri) && strcmp (cmd, "backup") != 0) ||
      (o.b.all && strcmp (cmd, "verify") != 0) ||
      (o.b.at >= 0 && strcmp (cmd, "restore") != 0 &&
       strcmp (cmd, "verify") != 0)) {
    fprintf (stderr, "snapfg-backup: %s: an option that is not this "
             "command's (see snapfg-backup --help)\n", cmd);
    status = EXIT_USAGE;
    goto out;
  }
  if (strcmp (cmd, "init") == 0) {
    if (wrong_usage (nops != 1 || o.disk, INIT_SYNOPSIS)) {
      status = EXIT_USAGE;
      goto out;
    }
    status = cmd_init (&o, loc);
  }
  else if (strcmp (cmd, "backup") == 0) {
    if (wrong_usage (nops != 1 || o.disk == NULL, o.b.ndisks > 1
                     ? GROUP_SYNOPSIS : BACKUP_SYNOPSIS))
      status = EXIT_USAGE;
    else if (o.b.ndisks > 1)
      status = repo_cmd_backup_group (&o, loc);
    else if (o.b.socket == NULL || o.b.uri == NULL) {
      fprintf (stderr, "snapfg-backup: backup: give the server's control "
               "socket with -S CONTROL and its NBD URI with -u NBD_URI\n");
      status = EXIT_USAGE;
    }
    else if (o.b.pre_snapshot || o.b.post_snapshot)
      status = repo_cmd_backup_group (&o, loc);   /* one disk, hooks */
    else
      status = repo_cmd_backup (&o, loc);
  }
  else if (strcmp (cmd, "restore") == 0) {
    if (wrong_usage (nops != 2 || o.disk == NULL, RESTORE_SYNOPSIS))
      status = EXIT_USAGE;
    else
      status = repo_cmd_restore (&o, loc, argv[optind + 1]);
  }
  else if (strcmp (cmd, "verify") == 0) {
    if (wrong_usage (nops != 1 || (o.b.at >= 0 && o.b.all), VERIFY_SYNOPSIS))
      status = EXIT_USAGE;
    else
      status = repo_cmd_verify (&o, loc);
  }
  else if (strcmp (cmd, "list") == 0) {
    if (wrong_usage (nops != 1 || o.b.key_file, LIST_SYNOPSIS))
      status = EXIT_USAGE;
    else
      status = repo_cmd_list (&o, loc);
  }
  else if (strcmp (cmd, "prune") == 0) {
    if (wrong_usage (nops != 1 || !o.keep_given || o.b.key_file,
                     PRUNE_SYNOPSIS))
      status = EXIT_USAGE;
    else
      status = repo_cmd_prune (&o, loc);
  }
  else if (strcmp (cmd, "gc") == 0) {
    if (wrong_usage (nops != 1 || o.disk || o.b.key_file, GC_SYNOPSIS))
      status = EXIT_USAGE;
    else
      status = repo_cmd_gc (&o, loc);
  }
  else
    return -1;

 out:
  if (tool_out.json && !tool_out.result_printed)
    tool_json_result (json_pack ("{s:s}", "command", cmd), status);
  return status;
}
