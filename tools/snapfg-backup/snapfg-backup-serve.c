/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: the serve command.
 *
 *   snapfg-backup serve REPO [--disk NAME] [--at N] -U SOCKET | --tcp PORT
 *                 [--writable] [--tls=on|require --tls-psk=F |
 *                 --tls-certificates=DIR] [--limit-rate R] [--key-file F]
 *
 * Serves one backed-up point as an NBD export, in the foreground, until
 * SIGTERM, without restoring it first: the process becomes nbdkit
 * (exec), so the signal reaches the server itself.
 *
 *   - a qcow2 backup directory (REPO with --disk: REPO/NAME, the layout
 *     backup with several --disks makes): nbdkit's nbd plugin runs
 *     qemu-nbd read-only on the run's top image, with the same image
 *     options as restore (the chain checked against the manifest first,
 *     the key of an encrypted chain);
 *   - a repository (REPO holds "config", or is s3://...): nbdkit runs
 *     this project's snapfg-repo plugin, which reads only the chunks a
 *     request touches.
 *
 * Read-only unless --writable, which puts nbdkit's cow filter in front:
 * writes go to an overlay in $TMPDIR that nbdkit deletes as soon as it
 * has created it, so nothing written survives the server.  --limit-rate
 * puts nbdkit's rate filter in front (it counts bits: the rate is given
 * to it times 8).
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <unistd.h>
#include <sys/stat.h>

#include "snapfg-backup.h"

/* Room for nbdkit's own arguments, the filters' and the plugin's. */
#define MAX_ARGS 64

struct nbdkit_cmd {
  char *argv[MAX_ARGS];
  size_t n;
  char bufs[16][PATH_MAX + 64];
  size_t nbufs;
};

static void
add (struct nbdkit_cmd *c, const char *arg)
{
  if (c->n < MAX_ARGS - 1)
    c->argv[c->n++] = (char *) arg;
}

/* Add "FMT..." (a formatted argument kept in the struct). */
static void __attribute__ ((format (printf, 2, 3)))
addf (struct nbdkit_cmd *c, const char *fmt, ...)
{
  va_list ap;
  char *b;

  if (c->nbufs >= sizeof c->bufs / sizeof c->bufs[0])
    return;
  b = c->bufs[c->nbufs++];
  va_start (ap, fmt);
  vsnprintf (b, sizeof c->bufs[0], fmt, ap);
  va_end (ap);
  add (c, b);
}

/* nbdkit's options and filters, the same for both kinds of point. */
static void
nbdkit_front (struct nbdkit_cmd *c, const struct backup_options *o)
{
  add (c, "nbdkit");
  add (c, "--foreground");
  if (o->serve_socket) {
    add (c, "-U");
    add (c, o->serve_socket);
  }
  else {
    add (c, "-p");
    add (c, o->tcp_port);
  }
  if (o->tls)
    addf (c, "--tls=%s", o->tls);
  if (o->tls_psk)
    addf (c, "--tls-psk=%s", o->tls_psk);
  if (o->tls_certificates)
    addf (c, "--tls-certificates=%s", o->tls_certificates);
  if (o->limit_rate)
    add (c, "--filter=rate");
  if (o->writable)
    add (c, "--filter=cow");
  else
    add (c, "-r");
}

static void
nbdkit_rate (struct nbdkit_cmd *c, const struct backup_options *o)
{
  if (o->limit_rate)
    addf (c, "rate=%" PRIu64, o->limit_rate * 8);
}

/* Replace this process with nbdkit.  Returns only on failure. */
static int
exec_nbdkit (struct nbdkit_cmd *c, const char *what)
{
  c->argv[c->n] = NULL;
  backup_info ("serving %s", what);
  fflush (stderr);
  fflush (stdout);
  execvp (c->argv[0], c->argv);
  backup_error ("cannot run nbdkit: %m (is it installed?)");
  return EXIT_FAILED;
}

/* A repository, not a qcow2 backup directory? */
bool
backup_is_repository (const char *location)
{
  char path[PATH_MAX];
  struct stat st;

  if (strncmp (location, "s3://", 5) == 0)
    return true;
  snprintf (path, sizeof path, "%s/config", location);
  return stat (path, &st) == 0 && S_ISREG (st.st_mode);
}

static int
serve_repository (const struct backup_options *o, const char *repo)
{
  const char *plugin = getenv ("SNAPFG_REPO_PLUGIN");
  struct nbdkit_cmd c = { .n = 0 };
  char what[PATH_MAX + 128];

  if (o->disk == NULL) {
    backup_error ("serve %s: a repository holds several disks: say which "
                  "with --disk NAME", repo);
    return EXIT_USAGE;
  }
  nbdkit_front (&c, o);
  add (&c, plugin && *plugin ? plugin : "snapfg-repo");
  addf (&c, "repo=%s", repo);
  addf (&c, "disk=%s", o->disk);
  if (o->at >= 0)
    addf (&c, "at=%ld", o->at);
  if (o->key_file)
    addf (&c, "key-file=%s", o->key_file);
  nbdkit_rate (&c, o);
  snprintf (what, sizeof what, "disk %s of repository %s (run %ld, %s) on "
            "%s%s", o->disk, repo, o->at, o->writable
            ? "writable, writes thrown away at exit" : "read-only",
            o->serve_socket ? o->serve_socket : "port ",
            o->serve_socket ? "" : o->tcp_port);
  if (o->at < 0)
    snprintf (what, sizeof what, "disk %s of repository %s (its latest run, "
              "%s) on %s%s", o->disk, repo, o->writable
              ? "writable, writes thrown away at exit" : "read-only",
              o->serve_socket ? o->serve_socket : "port ",
              o->serve_socket ? "" : o->tcp_port);
  return exec_nbdkit (&c, what);
}

/* The run asked for (--at N, or the latest), not one being pruned. */
static json_t *
serve_find_run (const struct backup_options *o, const char *dir,
                json_t *manifest)
{
  json_t *runs = json_object_get (manifest, "runs");
  size_t n = json_array_size (runs);
  json_t *run = o->at < 0 ? json_array_get (runs, n - 1)
    : manifest_run (manifest, o->at);

  if (run == NULL) {
    if (n == 0)
      backup_error ("%s: the manifest records no run yet", dir);
    else
      backup_error ("%s: no run %ld (runs %" PRIu64 " to %" PRIu64 ")",
                    dir, o->at, json_u64 (json_array_get (runs, 0), "seq"),
                    json_u64 (json_array_get (runs, n - 1), "seq"));
    return NULL;
  }
  if (json_is_true (json_object_get (run, "pruning"))) {
    backup_error ("%s: run %" PRIu64 " is being pruned (an interrupted "
                  "prune): it cannot be served; run prune again", dir,
                  json_u64 (run, "seq"));
    return NULL;
  }
  return run;
}

static int
serve_chain (const struct backup_options *o, const char *repo)
{
  char dir[PATH_MAX], err[1024], what[PATH_MAX * 2 + 128];
  struct nbdkit_cmd c = { .n = 0 };
  struct qemu_nbd_args q;
  struct image_access img_access;
  struct backup_dir d;
  json_t *manifest, *run;
  char **chain = NULL;
  bool missing;
  int depth, status;
  uint64_t seq;

  if (o->disk)
    snprintf (dir, sizeof dir, "%s/%s", repo, o->disk);
  else
    snprintf (dir, sizeof dir, "%s", repo);
  if (o->disk && access (dir, F_OK) == -1 && errno == ENOENT) {
    backup_error ("%s: no such directory: %s has no disk %s", dir, repo,
                  o->disk);
    return EXIT_FAILED;
  }
  if (open_backup_dir (dir, false, &d) == -1)
    return EXIT_FAILED;
  manifest = manifest_read (d.fd, dir, &missing, err, sizeof err);
  if (manifest == NULL) {
    if (missing && o->disk)
      backup_error ("%s: no manifest.json: %s has no disk %s", dir, repo,
                    o->disk);
    else if (missing)
      backup_error ("%s: no manifest.json: not a snapfg-backup directory "
                    "(for a directory of several disks, name one with "
                    "--disk NAME)", dir);
    else
      backup_error ("%s", err);
    return EXIT_FAILED;
  }
  run = serve_find_run (o, dir, manifest);
  if (run == NULL) {
    json_decref (manifest);
    return EXIT_FAILED;
  }
  status = key_status (o, run);
  if (status != EXIT_OK || run_access (o, run, &img_access) == -1) {
    json_decref (manifest);
    return status != EXIT_OK ? status : EXIT_FAILED;
  }
  seq = json_u64 (run, "seq");
  depth = chain_check (d.fd, dir, manifest, run, &chain);
  json_decref (manifest);
  if (depth < 0)
    return EXIT_FAILED;
  image_qemu_nbd_args (dir, chain[0], depth, &img_access, true, &q);
  chain_free (chain);

  nbdkit_front (&c, o);
  add (&c, "nbd");
  addf (&c, "command=%s", q.argv[0]);
  for (size_t i = 1; q.argv[i]; ++i)
    addf (&c, "arg=%s", q.argv[i]);
  nbdkit_rate (&c, o);
  snprintf (what, sizeof what, "run %" PRIu64 " of %s (%s) on %s%s%s",
            seq, dir, o->writable ? "writable, writes thrown away at exit"
            : "read-only", o->serve_socket ? o->serve_socket : "port ",
            o->serve_socket ? "" : o->tcp_port,
            o->limit_rate ? ", rate limited" : "");
  return exec_nbdkit (&c, what);
}

int
cmd_serve (const struct backup_options *o, const char *repo)
{
  if (backup_is_repository (repo))
    return serve_repository (o, repo);
  return serve_chain (o, repo);
}
