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
static json_t *
drop_unneeded_checkpoints (const struct backup_options *o, json_t *manifest)
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
      if (!o->json)
        backup_info ("dropped checkpoint %s (no run needs it%s%s)", n,
                     json_str (v, "owner") ? ", made for " : "",
                     json_str (v, "owner") ? json_str (v, "owner") : "");
    }
    json_decref (r);
  }
  json_decref (reply);
  return dropped;
}

int
cmd_prune (const struct backup_options *o, const char *dir_path)
{
  struct backup_dir d;
  json_t *manifest = NULL, *runs, *keep_run, *v, *removed = json_array ();
  json_t *files = json_array (), *dropped = NULL, *full_owner;
  struct image_access a;
  char err[1024], **chain = NULL, opts[PATH_MAX * 4];
  const char *full;
  bool missing;
  size_t n, from, i;
  int depth, status = EXIT_FAILED;

  if (open_backup_dir (dir_path, false, &d) == -1)
    goto out_nodir;
  if (check_private_dir (&d) == -1 || lock_backup_dir (&d) == -1)
    goto out;
  manifest = manifest_read (d.fd, dir_path, &missing, err, sizeof err);
  if (manifest == NULL) {
    backup_error ("%s", missing ? "no manifest.json: not a snapfg-backup "
                  "directory" : err);
    goto out;
  }
  runs = json_object_get (manifest, "runs");
  n = json_array_size (runs);
  if (n == 0) {
    backup_error ("%s: the manifest records no run yet", dir_path);
    goto out;
  }
  if (clean_leftovers (&d, json_array_get (runs, n - 1)) == -1)
    goto out;
  /* The first run kept: after the last N, or after an interrupted
   * prune's marks (its commit may be half done: finish it).
   */
  from = n > (size_t) o->keep_last ? n - o->keep_last : 0;
  json_array_foreach (runs, i, v)
    if (json_is_true (json_object_get (v, "pruning")) && i + 1 > from)
      from = i + 1;
  if (from >= n) {
    backup_error ("%s: an interrupted prune marked every run: the "
                  "directory is damaged", dir_path);
    goto out;
  }
  keep_run = json_array_get (runs, from);
  if (from == 0) {
    if (!o->json)
      backup_info ("%s: %zu runs, --keep-last %ld: nothing to prune",
                   dir_path, n, o->keep_last);
    status = EXIT_OK;
    goto checkpoints;
  }
  status = key_status (o, keep_run);
  if (status != EXIT_OK)
    goto out;
  status = EXIT_FAILED;
  if (run_access (o, keep_run, &a) == -1)
    goto out;
  depth = chain_check (d.fd, dir_path, manifest, keep_run, &chain);
  if (depth < 0)
    goto out;
  full = chain[depth - 1];
  full_owner = NULL;
  json_array_foreach (runs, i, v)
    if (!json_is_true (json_object_get (v, "empty")) && run_image (v) &&
        strcmp (run_image (v), full) == 0)
      full_owner = v;

  /* 1.  The kept images over K's will be rebased onto F: a reader
   * accepts either backing name meanwhile.
   */
  for (i = 0; i < from; ++i)
    json_object_set_new (json_array_get (runs, i), "pruning", json_true ());
  for (i = from + 1; depth > 1 && i < n; ++i) {
    v = json_array_get (runs, i);
    if (!json_is_true (json_object_get (v, "empty")) &&
        json_str (v, "backing") && strcmp (json_str (v, "backing"), chain[0]) == 0)
      json_object_set_new (v, "rebase_to", json_string (full));
  }
  if (manifest_write (d.fd, dir_path, manifest, err, sizeof err) == -1) {
    backup_error ("%s", err);
    goto out;
  }

  if (depth > 1) {
    /* 2. */
    const char *commit_args[] = { "-d", "-b", full, NULL };
    const char *top = chain[0];
    image_opts (top, depth, &a, opts, sizeof opts);
    if (!o->json)
      backup_info ("committing run %" PRIu64 "'s chain (%d images) into %s",
                   json_u64 (keep_run, "seq"), depth, full);
    test_pause ("prune-marked");
    if (a.key_file == NULL) {
      if (run_qemu_img (dir_path, &a, "commit", commit_args, opts) == -1)
        goto out;
    }
    else
      /* With the keys in its options the backing images' names are
       * json: names, which -b cannot match: commit one image at a time
       * into the next, top down (each keeps its data, -d; what reads
       * through them is unchanged, as above).
       */
      for (int j = 0; j + 1 < depth; ++j) {
        const char *one[] = { "-d", NULL };
        image_opts (chain[j], depth - j, &a, opts, sizeof opts);
        if (run_qemu_img (dir_path, &a, "commit", one, opts) == -1)
          goto out;
      }
    if (fsync_file (d.fd, full) == -1) {
      backup_error ("%s/%s: fsync: %m", dir_path, full);
      goto out;
    }
    /* 3. */
    for (i = from + 1; i < n; ++i) {
      v = json_array_get (runs, i);
      if (!json_is_true (json_object_get (v, "empty")) &&
          json_str (v, "backing") && strcmp (json_str (v, "backing"), top) == 0) {
        const char *rebase_args[] = { "-u", "-b", full, "-F", "qcow2", NULL };
        image_opts (run_image (v), 1, &a, opts, sizeof opts);
        if (run_qemu_img (dir_path, &a, "rebase", rebase_args, opts) == -1 ||
            fsync_file (d.fd, run_image (v)) == -1)
          goto out;
      }
    }
  }

  test_pause ("prune-rebased");

  /* 4. The runs that go, and the names that change. */
  for (i = 0; i < from; ++i) {
    v = json_array_get (runs, 0);
    json_array_append_new (removed, json_integer (json_u64 (v, "seq")));
    if (run_image (v))
      json_array_append_new (files, json_string (run_image (v)));
    if (json_str (v, "sums"))
      json_array_append_new (files, json_string (json_str (v, "sums")));
    if (v == full_owner && json_str (v, "checkpoint") &&
        !json_str (keep_run, "diff_checkpoint"))
      json_object_set_new (keep_run, "diff_checkpoint",
                           json_string (json_str (v, "diff_checkpoint")
                                        ? json_str (v, "diff_checkpoint")
                                        : json_str (v, "checkpoint")));
    json_array_remove (runs, 0);
  }
  if (depth > 1) {
    json_array_foreach (runs, i, v) {
      const char *img = run_image (v), *b = json_str (v, "backing");
      if (img && strcmp (img, chain[0]) == 0)
        json_object_set_new (v, "image", json_string (full));
      if (b && strcmp (b, chain[0]) == 0)
        json_object_set_new (v, "backing", json_string (full));
      json_object_del (v, "rebase_to");
    }
    for (i = 1; i + 1 < (size_t) depth; ++i)
      json_array_append_new (files, json_string (chain[i]));
    json_array_append_new (files, json_string (chain[0]));
  }
  if (strcmp (json_str (keep_run, "type") ? json_str (keep_run, "type") : "",
              "full") != 0) {
    json_object_set_new (keep_run, "type", json_string ("full"));
    json_object_set_new (keep_run, "image", json_string (full));
    json_object_del (keep_run, "backing");
    json_object_del (keep_run, "since");
    json_object_del (keep_run, "base");
    json_object_del (keep_run, "empty");
    json_object_set_new (keep_run, "pruned", json_true ());
  }
  /* A successful verify was of the images as they were: the commit
   * rewrote the full image under every kept run (a failed one stays
   * recorded: the damage may be in what was kept).
   */
  json_array_foreach (runs, i, v)
    if (depth > 1 || v == keep_run)
      json_object_del (v, "verified");
  json_array_foreach (runs, i, v)
    if (json_integer_value (json_object_get (v, "base")) > 0 &&
        json_u64 (v, "base") < json_u64 (keep_run, "seq"))
      json_object_set_new (v, "base", json_integer (json_u64 (keep_run, "seq")));
  if (manifest_write (d.fd, dir_path, manifest, err, sizeof err) == -1) {
    backup_error ("%s", err);
    goto out;
  }

  /* 5.  Only what no kept run names goes (an empty run names the image
   * of the run before it), and only what went is reported.
   */
  for (i = 0; i < json_array_size (files); ) {
    const char *f = json_string_value (json_array_get (files, i));
    if (referenced (runs, 0, f) ||
        (unlinkat (d.fd, f, 0) == -1 && errno != ENOENT)) {
      json_array_remove (files, i);
      continue;
    }
    if (!o->json)
      backup_info ("removed %s", f);
    i++;
  }
  fsync_dir (d.fd);
  if (!o->json)
    backup_info ("%s: kept runs %" PRIu64 " to %" PRIu64 "; run %" PRIu64
                 " is now a full run (%s)", dir_path,
                 json_u64 (keep_run, "seq"),
                 json_u64 (json_array_get (runs, json_array_size (runs) - 1),
                           "seq"), json_u64 (keep_run, "seq"), full);
  status = EXIT_OK;

 checkpoints:
  /* 6. */
  if (o->socket)
    dropped = drop_unneeded_checkpoints (o, manifest);
  else if (!o->json)
    backup_info ("the server's checkpoints are not checked: give -S CONTROL "
                 "to drop those no run needs");

 out:
  if (o->json)
    tool_json_result (json_pack ("{s:s, s:b, s:O, s:o, s:o}", "dir", dir_path,
                           "ok", status == EXIT_OK,
                           "removed_runs", removed,
                           "removed_files", files,
                           "dropped_checkpoints",
                           dropped ? dropped : json_array ()),
                      status);
  else
    json_decref (files), json_decref (dropped);
  json_decref (removed);
  chain_free (chain);
  json_decref (manifest);
  if (d.lock_fd >= 0)
    close (d.lock_fd);
  close (d.fd);
  return status;

 out_nodir:
  json_decref (removed);
  json_decref (files);
  return status;
}
