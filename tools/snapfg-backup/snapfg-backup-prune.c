/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: the prune command.
 *
 * prune DIR --keep-last N keeps the last N runs.  The oldest run kept
 * (K) usually reads through images of runs that go: its chain is
 * committed into the full image at the bottom (F), so that F alone is
 * K's disk; the kept runs over K's image are rebased onto F (their data
 * is unchanged), K becomes a full run whose image is F, and what no kept
 * run names is removed.  A differential kept over F stays right: it
 * holds every block written since F's instant, a superset of what the
 * commit changed.
 *
 * Order, so that a crash anywhere leaves every kept run readable and
 * the prune can simply be run again:
 *   1. the runs that go are marked "pruning" in the manifest (restore
 *      and verify refuse them: the commit changes F under them; reading
 *      K and later through their chains stays exact, as the commit
 *      writes under images that hide what it changes), and the kept
 *      images over K's get "rebase_to": F (their chain may name either);
 *   2. qemu-img commit of K's chain into F (the top images keep their
 *      data: -d);
 *   3. the kept images over K's are rebased onto F (-u: the header's
 *      name only);
 *   4. the manifest without the runs that go, K as a full run of F;
 *   5. the files no kept run names are removed;
 *   6. with -S, this chain's checkpoints that no run needs are dropped.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <inttypes.h>
#include <limits.h>
#include <unistd.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>

#include "snapfg-backup.h"

/* Does a kept run name FILE (as its image, backing or sums)? */
static bool
referenced (json_t *runs, size_t from, const char *file)
{
  json_t *v;
  size_t i;

  json_array_foreach (runs, i, v)
    if (i >= from &&
        ((run_image (v) && strcmp (run_image (v), file) == 0) ||
         (json_str (v, "backing") && strcmp (json_str (v, "backing"), file) == 0) ||
         (json_str (v, "sums") && strcmp (json_str (v, "sums"), file) == 0)))
      return true;
  return false;
}

/* QEMU's --image-opts for DIR-relative NAME with the key for DEPTH
 * images of its chain (none without a key).
 */
static void
image_opts (const char *name, size_t depth, const struct image_access *a,
            char *out, size_t len)
{
  snprintf (out, len, "driver=qcow2,file.filename=%s", name);
  for (size_t i = 0; a->key_file && i < depth; ++i) {
    strncat (out, ",", len - strlen (out) - 1);
    for (size_t j = 0; j < i; ++j)
      strncat (out, "backing.", len - strlen (out) - 1);
    strncat (out, "encrypt.key-secret=" KEY_SECRET_ID, len - strlen (out) - 1);
  }
}

static int
run_qemu_img (const char *dir, const struct image_access *a,
              const char *verb, const char *extra[], const char *opts)
{
  char secret[PATH_MAX + 64];
  char *argv[16];
  size_t n = 0;

  argv[n++] = "qemu-img";
  argv[n++] = (char *) verb;
  argv[n++] = "-q";
  if (a->key_file) {
    snprintf (secret, sizeof secret,
              "secret,id=" KEY_SECRET_ID ",format=raw,file=%s", a->key_file);
    argv[n++] = "--object";
    argv[n++] = secret;
  }
  for (size_t i = 0; extra[i]; ++i)
    argv[n++] = (char *) extra[i];
  argv[n++] = "--image-opts";
  argv[n++] = (char *) opts;
  argv[n] = NULL;
  return run_command (dir, argv, dir);
}

/* Is checkpoint NAME, made by snapfg-backup for the directory OWNER
 * ("HOST:DIR", see snapfgctl checkpoint list), one no chain needs: made
 * on this host for a directory that is gone, or that now holds another
 * chain?  A directory that exists without a manifest (a file system not
 * mounted yet) keeps its checkpoints.
 */
static bool
orphaned (const char *name, const char *owner)
{
  const char *tag = "snapfg-backup-", *path, *colon;
  char host[256] = "", chain[16], err[256];
  json_t *m;
  bool missing, gone;
  struct stat st;
  int fd;

  if (owner == NULL || strncmp (name, tag, strlen (tag)) != 0 ||
      sscanf (name + strlen (tag), "%8[0-9a-f]-", chain) != 1 ||
      (colon = strchr (owner, ':')) == NULL)
    return false;
  gethostname (host, sizeof host - 1);
  path = colon + 1;
  if ((size_t) (colon - owner) != strlen (host) ||
      strncmp (owner, host, colon - owner) != 0 || path[0] != '/')
    return false;
  if (lstat (path, &st) == -1)
    return errno == ENOENT;
  fd = open (path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd == -1)
    return false;
  m = manifest_read (fd, path, &missing, err, sizeof err);
  close (fd);
  gone = m && json_str (m, "chain_id") &&
    strcmp (json_str (m, "chain_id"), chain) != 0;
  json_decref (m);
  return gone;
}

/* 6. This chain's checkpoints on the server that no run needs: all but
 * the last run's, and the one a next differential starts from.
 */
json_t *
drop_unneeded_checkpoints (const struct backup_options *o, json_t *manifest,
                           bool tell_own)
{
  json_t *runs = json_object_get (manifest, "runs");
  json_t *last = json_array_get (runs, json_array_size (runs) - 1);
  const char *keep1 = json_str (last, "checkpoint");
  const char *keep2 = diff_checkpoint_to_keep (runs);
  json_t *req = control_request (CONTROL_CHECKPOINT_LIST);
  json_t *reply, *v, *dropped = json_array ();
  char prefix[64], err[512];
  size_t i;

  snprintf (prefix, sizeof prefix, "snapfg-backup-%s-",
            json_str (manifest, "chain_id"));
  reply = control_call (o, req, err, sizeof err);
  json_decref (req);
  if (reply == NULL) {
    backup_error ("warning: listing the server's checkpoints: %s", err);
    return dropped;
  }
  json_array_foreach (json_object_get (reply, "checkpoints"), i, v) {
    const char *n = json_str (v, "name");
    json_t *r;
    if (n == NULL)
      continue;
    if (strncmp (n, prefix, strlen (prefix)) != 0) {
      if (!orphaned (n, json_str (v, "owner")))
        continue;
    }
    else if ((keep1 && strcmp (n, keep1) == 0) ||
             (keep2 && strcmp (n, keep2) == 0))
      continue;
    req = control_request (CONTROL_CHECKPOINT_DROP);
    control_request_set_string (req, "name", n);
    r = control_call (o, req, err, sizeof err);
    json_decref (req);
    if (r == NULL)
      backup_error ("warning: dropping checkpoint %s: %s", n, err);
    else {
      json_array_append_new (dropped, json_string (n));
      if (!o->json && (tell_own || strncmp (n, prefix, strlen (prefix)) != 0))
        backup_info ("dropped checkpoint %s (no run needs it%s%s)", n,
                     json_str (v, "owner") ? ", made for " : "",
                     json_str (v, "owner") ? json_str (v, "owner") : "");
    }
    json_decref (r);
  }
  json_decref (reply);
  return dropped;
}

/* One prune: the directory, its manifest, and what goes. */
struct prune {
  const struct backup_options *o;
  const char *dir_path;
  struct backup_dir d;
  json_t *manifest, *runs;
  size_t n, from;               /* runs, and the index of K */
  json_t *keep_run;             /* K */
  json_t *full_owner;           /* the run whose image is F */
  struct image_access a;
  char **chain;                 /* K's images, K's first, F last */
  int depth;
  const char *full;             /* F */
  json_t *removed, *files, *dropped;
  char opts[PATH_MAX * 4];
};

/* The directory, locked, and its manifest: 0, or -1 after a message. */
static int
prune_open (struct prune *p)
{
  char err[1024];
  bool missing;

  if (check_private_dir (&p->d) == -1 || lock_backup_dir (&p->d) == -1)
    return -1;
  p->manifest = manifest_read (p->d.fd, p->dir_path, &missing,
                               err, sizeof err);
  if (p->manifest == NULL) {
    backup_error ("%s", missing ? "no manifest.json: not a snapfg-backup "
                  "directory" : err);
    return -1;
  }
  p->runs = json_object_get (p->manifest, "runs");
  p->n = json_array_size (p->runs);
  if (p->n == 0) {
    backup_error ("%s: the manifest records no run yet", p->dir_path);
    return -1;
  }
  return clean_leftovers (&p->d, json_array_get (p->runs, p->n - 1));
}

/* The first run kept (K): after the last N, or after an interrupted
 * prune's marks (its commit may be half done: finish it).  0, or -1
 * after a message.
 */
static int
prune_choose_kept (struct prune *p)
{
  json_t *v;
  size_t i;

  p->from = p->n > (size_t) p->o->keep_last ? p->n - p->o->keep_last : 0;
  json_array_foreach (p->runs, i, v)
    if (json_is_true (json_object_get (v, "pruning")) && i + 1 > p->from)
      p->from = i + 1;
  if (p->from >= p->n) {
    backup_error ("%s: an interrupted prune marked every run: the "
                  "directory is damaged", p->dir_path);
    return -1;
  }
  p->keep_run = json_array_get (p->runs, p->from);
  return 0;
}

/* K's key and chain, and the run whose image is its full one (F).
 * EXIT_OK, or the exit status after a message.
 */
static int
prune_read_chain (struct prune *p)
{
  json_t *v;
  size_t i;
  int status = key_status (p->o, p->keep_run);

  if (status != EXIT_OK)
    return status;
  if (run_access (p->o, p->keep_run, &p->a) == -1)
    return EXIT_FAILED;
  p->depth = chain_check (p->d.fd, p->dir_path, p->manifest, p->keep_run,
                          &p->chain);
  if (p->depth < 0)
    return EXIT_FAILED;
  p->full = p->chain[p->depth - 1];
  p->full_owner = NULL;
  json_array_foreach (p->runs, i, v)
    if (!json_is_true (json_object_get (v, "empty")) && run_image (v) &&
        strcmp (run_image (v), p->full) == 0)
      p->full_owner = v;
  return EXIT_OK;
}

/* 1.  The runs that go are marked; the kept images over K's will be
 * rebased onto F: a reader accepts either backing name meanwhile.
 */
static int
prune_mark (struct prune *p)
{
  char err[1024];
  json_t *v;
  size_t i;

  for (i = 0; i < p->from; ++i)
    json_object_set_new (json_array_get (p->runs, i), "pruning",
                         json_true ());
  for (i = p->from + 1; p->depth > 1 && i < p->n; ++i) {
    v = json_array_get (p->runs, i);
    if (!json_is_true (json_object_get (v, "empty")) &&
        json_str (v, "backing") &&
        strcmp (json_str (v, "backing"), p->chain[0]) == 0)
      json_object_set_new (v, "rebase_to", json_string (p->full));
  }
  if (manifest_write (p->d.fd, p->dir_path, p->manifest, err, sizeof err)
      == -1) {
    backup_error ("%s", err);
    return -1;
  }
  return 0;
}

/* 2.  K's chain committed into F. */
static int
prune_commit (struct prune *p)
{
  const char *commit_args[] = { "-d", "-b", p->full, NULL };

  image_opts (p->chain[0], p->depth, &p->a, p->opts, sizeof p->opts);
  if (!p->o->json)
    backup_info ("committing run %" PRIu64 "'s chain (%d images) into %s",
                 json_u64 (p->keep_run, "seq"), p->depth, p->full);
  test_pause ("prune-marked");
  if (p->a.key_file == NULL) {
    if (run_qemu_img (p->dir_path, &p->a, "commit", commit_args, p->opts)
        == -1)
      return -1;
  }
  else
    /* With the keys in its options the backing images' names are
     * json: names, which -b cannot match: commit one image at a time
     * into the next, top down (each keeps its data, -d; what reads
     * through them is unchanged, as above).
     */
    for (int j = 0; j + 1 < p->depth; ++j) {
      const char *one[] = { "-d", NULL };
      image_opts (p->chain[j], p->depth - j, &p->a, p->opts, sizeof p->opts);
      if (run_qemu_img (p->dir_path, &p->a, "commit", one, p->opts) == -1)
        return -1;
    }
  if (fsync_file (p->d.fd, p->full) == -1) {
    backup_error ("%s/%s: fsync: %m", p->dir_path, p->full);
    return -1;
  }
  return 0;
}

/* 3.  The kept images over K's rebased onto F. */
static int
prune_rebase (struct prune *p)
{
  const char *top = p->chain[0];
  json_t *v;

  for (size_t i = p->from + 1; i < p->n; ++i) {
    v = json_array_get (p->runs, i);
    if (!json_is_true (json_object_get (v, "empty")) &&
        json_str (v, "backing") && strcmp (json_str (v, "backing"), top) == 0) {
      const char *rebase_args[] = { "-u", "-b", p->full, "-F", "qcow2", NULL };
      image_opts (run_image (v), 1, &p->a, p->opts, sizeof p->opts);
      if (run_qemu_img (p->dir_path, &p->a, "rebase", rebase_args, p->opts)
          == -1 ||
          fsync_file (p->d.fd, run_image (v)) == -1)
        return -1;
    }
  }
  return 0;
}

/* 4a.  The runs that go leave the manifest; their files are listed. */
static void
prune_forget_runs (struct prune *p)
{
  json_t *v;

  for (size_t i = 0; i < p->from; ++i) {
    v = json_array_get (p->runs, 0);
    json_array_append_new (p->removed, json_integer (json_u64 (v, "seq")));
    if (run_image (v))
      json_array_append_new (p->files, json_string (run_image (v)));
    if (json_str (v, "sums"))
      json_array_append_new (p->files, json_string (json_str (v, "sums")));
    if (v == p->full_owner && json_str (v, "checkpoint") &&
        !json_str (p->keep_run, "diff_checkpoint"))
      json_object_set_new (p->keep_run, "diff_checkpoint",
                           json_string (json_str (v, "diff_checkpoint")
                                        ? json_str (v, "diff_checkpoint")
                                        : json_str (v, "checkpoint")));
    json_array_remove (p->runs, 0);
  }
}

/* 4b.  The names that change: K's image is F now, K a full run. */
static void
prune_rename_images (struct prune *p)
{
  json_t *v;
  size_t i;

  if (p->depth > 1) {
    json_array_foreach (p->runs, i, v) {
      const char *img = run_image (v), *b = json_str (v, "backing");
      if (img && strcmp (img, p->chain[0]) == 0)
        json_object_set_new (v, "image", json_string (p->full));
      if (b && strcmp (b, p->chain[0]) == 0)
        json_object_set_new (v, "backing", json_string (p->full));
      json_object_del (v, "rebase_to");
    }
    for (i = 1; i + 1 < (size_t) p->depth; ++i)
      json_array_append_new (p->files, json_string (p->chain[i]));
    json_array_append_new (p->files, json_string (p->chain[0]));
  }
  if (strcmp (json_str (p->keep_run, "type") ? json_str (p->keep_run, "type")
              : "", "full") != 0) {
    json_object_set_new (p->keep_run, "type", json_string ("full"));
    json_object_set_new (p->keep_run, "image", json_string (p->full));
    json_object_del (p->keep_run, "backing");
    json_object_del (p->keep_run, "since");
    json_object_del (p->keep_run, "base");
    json_object_del (p->keep_run, "empty");
    json_object_set_new (p->keep_run, "pruned", json_true ());
  }
  /* A successful verify was of the images as they were: the commit
   * rewrote the full image under every kept run (a failed one stays
   * recorded: the damage may be in what was kept).
   */
  json_array_foreach (p->runs, i, v)
    if (p->depth > 1 || v == p->keep_run)
      json_object_del (v, "verified");
  json_array_foreach (p->runs, i, v)
    if (json_integer_value (json_object_get (v, "base")) > 0 &&
        json_u64 (v, "base") < json_u64 (p->keep_run, "seq"))
      json_object_set_new (v, "base",
                           json_integer (json_u64 (p->keep_run, "seq")));
}

/* Is F among the first I names of FILES? */
static bool
listed_before (json_t *files, size_t i, const char *f)
{
  for (size_t j = 0; j < i; ++j)
    if (strcmp (json_string_value (json_array_get (files, j)), f) == 0)
      return true;
  return false;
}

/* 5.  Only what no kept run names goes (an empty run names the image of
 * the run before it), and only what went is reported.
 */
static void
prune_remove_files (struct prune *p)
{
  for (size_t i = 0; i < json_array_size (p->files); ) {
    const char *f = json_string_value (json_array_get (p->files, i));
    if (listed_before (p->files, i, f) || referenced (p->runs, 0, f) ||
        (unlinkat (p->d.fd, f, 0) == -1 && errno != ENOENT)) {
      json_array_remove (p->files, i);
      continue;
    }
    if (!p->o->json)
      backup_info ("removed %s", f);
    i++;
  }
  fsync_dir (p->d.fd);
  if (!p->o->json)
    backup_info ("%s: kept runs %" PRIu64 " to %" PRIu64 "; run %" PRIu64
                 " is now a full run (%s)", p->dir_path,
                 json_u64 (p->keep_run, "seq"),
                 json_u64 (json_array_get (p->runs,
                                           json_array_size (p->runs) - 1),
                           "seq"), json_u64 (p->keep_run, "seq"), p->full);
}

/* Steps 1 to 5 for a directory with runs to remove: EXIT_OK, or the
 * exit status after a message.
 */
static int
prune_runs (struct prune *p)
{
  char err[1024];
  int status = prune_read_chain (p);

  if (status != EXIT_OK)
    return status;
  if (prune_mark (p) == -1)
    return EXIT_FAILED;
  if (p->depth > 1 && (prune_commit (p) == -1 || prune_rebase (p) == -1))
    return EXIT_FAILED;
  test_pause ("prune-rebased");
  prune_forget_runs (p);
  prune_rename_images (p);
  if (manifest_write (p->d.fd, p->dir_path, p->manifest, err, sizeof err)
      == -1) {
    backup_error ("%s", err);
    return EXIT_FAILED;
  }
  prune_remove_files (p);
  return EXIT_OK;
}

/* What prune prints last: with --json its object. */
static void
prune_report (struct prune *p, int status)
{
  if (p->o->json)
    tool_json_result (json_pack ("{s:s, s:b, s:O, s:O, s:O}",
                                 "dir", p->dir_path,
                                 "ok", status == EXIT_OK,
                                 "removed_runs", p->removed,
                                 "removed_files", p->files,
                                 "dropped_checkpoints", p->dropped),
                      status);
}

int
cmd_prune (const struct backup_options *o, const char *dir_path)
{
  struct prune p = { .o = o, .dir_path = dir_path,
                     .removed = json_array (), .files = json_array (),
                     .dropped = json_array () };
  int status = EXIT_FAILED;

  if (open_backup_dir (dir_path, false, &p.d) == -1) {
    json_decref (p.removed);
    json_decref (p.files);
    json_decref (p.dropped);
    return status;
  }
  if (prune_open (&p) == -1 || prune_choose_kept (&p) == -1)
    goto out;
  /* An encrypted chain's key is asked for even with nothing to prune:
   * a missing key gives the same status whatever the directory holds.
   */
  status = key_status (o, p.keep_run);
  if (status != EXIT_OK)
    goto out;
  if (p.from == 0) {
    if (!o->json)
      backup_info ("%s: %zu runs, --keep-last %ld: nothing to prune",
                   dir_path, p.n, o->keep_last);
    status = EXIT_OK;
  }
  else
    status = prune_runs (&p);

  /* 6. */
  if (status == EXIT_OK && o->socket) {
    json_decref (p.dropped);
    p.dropped = drop_unneeded_checkpoints (o, p.manifest, true);
  }
  else if (status == EXIT_OK && !o->json)
    backup_info ("the server's checkpoints are not checked: give -S CONTROL "
                 "to drop those no run needs");

 out:
  prune_report (&p, status);
  json_decref (p.removed);
  json_decref (p.files);
  json_decref (p.dropped);
  chain_free (p.chain);
  json_decref (p.manifest);
  if (p.d.lock_fd >= 0)
    close (p.d.lock_fd);
  close (p.d.fd);
  return status;
}
