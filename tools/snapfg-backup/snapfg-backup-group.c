/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: a backup of several disks at one instant, and the
 * hooks around the snapshots.
 *
 *   snapfg-backup backup REPO --disk a -S CTL_A -u URI_A
 *                             --disk b -S CTL_B -u URI_B
 *                             [--pre-snapshot CMD] [--post-snapshot CMD]
 *
 * REPO is a qcow2 backup directory (each disk the chain REPO/NAME) or a
 * repository (each disk's runs numbered under its name): either way
 * each disk's run is restorable on its own.  The group drives each
 * disk's run through struct group_run_kind (snapfg-backup.h), the same
 * order for both kinds:
 *
 *   1. every disk's run is prepared (what needs no server checked first,
 *      a repository's key; then its session opened, its directory or
 *      repository registration made, its server asked and connected):
 *      nothing is made on any server yet;
 *   2. the pre-snapshot hook runs (sh -c CMD); if it fails, nothing is
 *      made and the run ends (the post-snapshot hook still runs);
 *   3. every server holds new origin writes (control "suspend", with a
 *      timeout after which it resumes by itself, so that a backup host
 *      that dies here never freezes a VM);
 *   4. every snapshot (and checkpoint) is created: all of them have the
 *      same instant, since no server took a write in between;
 *   5. every server resumes; a server that had resumed by itself (its
 *      timeout passed) breaks the shared instant: the run fails;
 *   6. the post-snapshot hook runs;
 *   7. if anything failed in 3-5, every snapshot and checkpoint of the
 *      run is dropped (rolled back) and nothing is recorded; otherwise
 *      each disk's copy is made and recorded, each run's record naming
 *      the group (list shows it).
 *
 * The time writes were held (from the first suspend to the last resume)
 * is logged and in --json.  This file also holds how both command lines
 * take the disks (backup_disk_option, backup_disks_resolve).
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <time.h>
#include <unistd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "cleanup.h"
#include "snapfg-backup.h"

/* Seconds after which a server resumes by itself: long enough for the
 * creates of every disk, short enough that a dead backup host costs a
 * VM little.
 */
#define GROUP_SUSPEND_TIMEOUT "10"

struct group_disk {
  const char *name;
  struct backup_options o;      /* -S, -u and the session: this disk's */
  void *run;                    /* the kind's */
  bool session_open, suspended;
  int status;                   /* of its copy */
};

struct group {
  struct backup_options *o;
  const char *repo;
  const struct group_run_kind *kind;
  void *opaque;                 /* the kind's, as given */
  struct group_disk *disks;
  size_t n;
  struct ssh_master ssh;        /* -H: the connection the disks share */
  char **ssh_options;           /* --ssh-option and the master's socket */
  char id[64];
  double held_s;
  bool held;
};

/* The hook's environment: what the run is about. */
static void
hook_environment (struct group *g, const char *which, int status)
{
  CLEANUP_FREE char *disks = NULL, *runs = NULL, *snaps = NULL, *dirs = NULL;
  size_t ld = 0, lr = 0, ls = 0, ldir = 0;
  FILE *fd = open_memstream (&disks, &ld), *fr = open_memstream (&runs, &lr);
  FILE *fs = open_memstream (&snaps, &ls), *fdir = open_memstream (&dirs, &ldir);

  if (!fd || !fr || !fs || !fdir)
    return;
  for (size_t i = 0; i < g->n; ++i) {
    struct group_disk *d = &g->disks[i];
    fprintf (fd, "%s%s", i ? " " : "", d->name);
    fprintf (fr, "%s%s=%ld", i ? " " : "", d->name, g->kind->seq (d->run));
    fprintf (fs, "%s%s=%s", i ? " " : "", d->name,
             g->kind->snapshot_name (d->run));
    fprintf (fdir, "%s%s=%s", i ? " " : "", d->name,
             g->kind->where (d->run));
  }
  fclose (fd);
  fclose (fr);
  fclose (fs);
  fclose (fdir);
  setenv ("SNAPFG_BACKUP_HOOK", which, 1);
  setenv ("SNAPFG_BACKUP_GROUP", g->id, 1);
  setenv ("SNAPFG_BACKUP_REPO", g->repo, 1);
  setenv ("SNAPFG_BACKUP_DISKS", disks, 1);
  setenv ("SNAPFG_BACKUP_RUNS", runs, 1);
  setenv ("SNAPFG_BACKUP_SNAPSHOTS", snaps, 1);
  if (g->kind->where_member)
    setenv ("SNAPFG_BACKUP_DIRS", dirs, 1);
  else
    unsetenv ("SNAPFG_BACKUP_DIRS");
  if (status >= 0)
    setenv ("SNAPFG_BACKUP_STATUS", status == EXIT_OK ? "ok" : "failed", 1);
  else
    unsetenv ("SNAPFG_BACKUP_STATUS");
}

/* Run a hook (sh -c CMD, its output on our stderr).  0, or -1 after a
 * message.
 */
static int
run_hook (struct group *g, const char *which, const char *cmd, int status)
{
  pid_t pid;
  int st;

  hook_environment (g, which, status);
  fflush (stdout);
  fflush (stderr);
  pid = fork ();
  if (pid == -1) {
    backup_error ("--%s-snapshot: fork: %m", which);
    return -1;
  }
  if (pid == 0) {
    /* Its standard output is ours only without --json. */
    if (tool_out.json)
      dup2 (2, 1);
    execl ("/bin/sh", "sh", "-c", cmd, (char *) NULL);
    _exit (127);
  }
  while (waitpid (pid, &st, 0) == -1)
    if (errno != EINTR) {
      backup_error ("--%s-snapshot: waitpid: %m", which);
      return -1;
    }
  if (WIFEXITED (st) && WEXITSTATUS (st) == 0)
    return 0;
  if (WIFEXITED (st))
    backup_error ("--%s-snapshot '%s' failed (exit status %d)", which, cmd,
                  WEXITSTATUS (st));
  else
    backup_error ("--%s-snapshot '%s' was killed by signal %d", which, cmd,
                  WTERMSIG (st));
  return -1;
}

static json_t *
group_call (struct group_disk *d, enum control_cmd cmd, const char *what)
{
  json_t *req = control_request (cmd), *reply;
  char err[512];

  if (cmd == CONTROL_SUSPEND)
    control_request_set_string (req, "timeout", GROUP_SUSPEND_TIMEOUT);
  reply = control_call (&d->o, req, err, sizeof err);
  json_decref (req);
  if (reply == NULL)
    backup_error ("disk %s: %s: %s", d->name, what, err);
  return reply;
}

/* 3-5: hold, snapshot, resume.  0, or -1 (every server resumed that
 * could be; the snapshots made are dropped by the caller).
 */
static int
group_snapshots (struct group *g)
{
  double t0 = tool_now ();
  const char *hold = getenv ("SNAPFG_BACKUP_TEST_HOLD_SECONDS");
  int r = 0;
  size_t i;

  for (i = 0; i < g->n && r == 0 && !backup_interrupted; ++i) {
    json_t *reply = group_call (&g->disks[i], CONTROL_SUSPEND,
                                "holding writes (suspend)");
    if (reply == NULL)
      r = -1;
    else
      g->disks[i].suspended = true;
    json_decref (reply);
  }
  g->held = true;
  for (i = 0; i < g->n && r == 0 && !backup_interrupted; ++i)
    if (g->kind->snapshot (g->disks[i].run) != EXIT_OK)
      r = -1;
  /* Tests only: the writes stay held this long (a host killed here),
   * unless a signal stops the run (the resumes below go at once).
   */
  if (hold && r == 0)
    for (int t = atoi (hold) * 10; t > 0 && !backup_interrupted; --t)
      usleep (100000);
  for (i = 0; i < g->n; ++i) {
    struct group_disk *d = &g->disks[i];
    json_t *reply;

    if (!d->suspended)
      continue;
    reply = group_call (d, CONTROL_RESUME, "resuming writes");
    d->suspended = false;
    if (reply && !json_is_true (json_object_get (reply, "resumed"))) {
      backup_error ("disk %s: its server had resumed by itself (its "
                    "timeout of " GROUP_SUSPEND_TIMEOUT " s passed) before "
                    "every snapshot was taken: the snapshots would not "
                    "share one instant; the run is rolled back", d->name);
      r = -1;
    }
    if (reply == NULL)
      r = -1;
    json_decref (reply);
  }
  if (backup_interrupted && r == 0) {
    backup_error ("interrupted: the run is rolled back");
    r = -1;
  }
  g->held_s = tool_now () - t0;
  backup_info ("writes held on %zu server%s for %.0f ms%s", g->n,
               g->n == 1 ? "" : "s", g->held_s * 1000,
               r == 0 ? "" : " (the run failed)");
  return r;
}

static void
group_id (struct group *g)
{
  unsigned char rnd[4] = { 0 };
  char when[32];
  time_t now = time (NULL);
  struct tm tm;

  if (getrandom (rnd, sizeof rnd, 0) != sizeof rnd)
    rnd[0] = getpid () & 0xff;
  gmtime_r (&now, &tm);
  strftime (when, sizeof when, "%Y%m%dT%H%M%SZ", &tm);
  snprintf (g->id, sizeof g->id, "%s-%02x%02x%02x%02x", when, rnd[0],
            rnd[1], rnd[2], rnd[3]);
}

/* -H with several disks: one ssh connection, made first, that every
 * disk's session runs over (snapfg-backup-ssh-master.c).
 */
static int
group_share_ssh (struct group *g)
{
  const struct backup_options *o = g->o;
  size_t n = o->nssh_options;
  int status;

  status = ssh_master_start (o, &g->ssh);
  if (status != EXIT_OK)
    return status;
  g->ssh_options = calloc (n + 2, sizeof *g->ssh_options);
  if (g->ssh_options == NULL) {
    backup_error ("out of memory");
    return EXIT_FAILED;
  }
  memcpy (g->ssh_options, o->ssh_options, n * sizeof *g->ssh_options);
  g->ssh_options[n] = g->ssh.option;
  /* Never a connection of its own: the master's or none. */
  g->ssh_options[n + 1] = (char *) "ControlMaster=no";
  for (size_t i = 0; i < g->n; ++i) {
    g->disks[i].o.ssh_options = g->ssh_options;
    g->disks[i].o.nssh_options = n + 2;
  }
  backup_info ("one ssh connection to %s for the %zu disks", o->host, g->n);
  return EXIT_OK;
}

/* 1: every disk's run, prepared: first what needs no server (a
 * repository's key), then the sessions (one ssh connection with -H)
 * and what needs the servers.
 */
static int
group_prepare (struct group *g)
{
  const struct group_run_kind *k = g->kind;
  int status;

  for (size_t i = 0; i < g->n; ++i) {
    struct group_disk *d = &g->disks[i];

    d->run = k->new (g->opaque, &d->o, g->repo, d->name, g->n > 1);
    if (d->run == NULL)
      return EXIT_FAILED;
    if (k->open && (status = k->open (d->run)) != EXIT_OK)
      return status;
  }
  if (g->o->host && g->n > 1) {
    status = group_share_ssh (g);
    if (status != EXIT_OK)
      return status;
  }
  for (size_t i = 0; i < g->n; ++i) {
    struct group_disk *d = &g->disks[i];

    status = session_open (&d->o, k->where (d->run));
    d->session_open = true;
    if (status != EXIT_OK)
      return status;
    status = k->prepare (d->run);
    if (status != EXIT_OK) {
      backup_error ("disk %s: the run cannot start; nothing was made on "
                    "any server", d->name);
      return status;
    }
  }
  return EXIT_OK;
}

static void
group_json (struct group *g, int status)
{
  json_t *o = json_pack ("{s:s, s:s, s:s, s:f, s:I}", "command", "backup",
                         "repository", g->repo, "group", g->id,
                         "held_s", g->held_s,
                         "held_ms", (json_int_t) (g->held_s * 1000 + 0.5));
  json_t *runs = json_array ();

  for (size_t i = 0; o && runs && i < g->n; ++i) {
    struct group_disk *d = &g->disks[i];
    json_t *rec = d->run ? g->kind->record_json (d->run) : NULL;
    json_t *x = rec ? json_deep_copy (rec) : json_object ();

    if (x == NULL)
      continue;
    json_object_set_new (x, "disk", json_string (d->name));
    if (g->kind->where_member && d->run)
      json_object_set_new (x, g->kind->where_member,
                           json_string (g->kind->where (d->run)));
    json_object_set_new (x, "ok", json_boolean (d->status == EXIT_OK &&
                                                rec != NULL));
    json_array_append_new (runs, x);
  }
  if (o)
    json_object_set_new (o, "runs", runs);
  tool_json_result (o, status);
}

int
backup_group (struct backup_options *o, const char *repo,
              const struct group_run_kind *kind, void *opaque)
{
  struct group g = { .o = o, .repo = repo, .kind = kind, .opaque = opaque,
                     .ssh = { .pid = -1 } };
  struct backup_disk single = { .name = NULL, .socket = o->socket,
                                .uri = o->uri };
  bool json = tool_out.json, hooks_failed = false;
  int status = EXIT_FAILED;
  json_t *info = NULL;

  /* One disk (hooks only): its -S and -u are the command's. */
  g.n = o->ndisks > 1 ? o->ndisks : 1;
  g.disks = calloc (g.n, sizeof *g.disks);
  if (g.disks == NULL) {
    backup_error ("out of memory");
    return EXIT_FAILED;
  }
  for (size_t i = 0; i < g.n; ++i) {
    struct group_disk *d = &g.disks[i];
    const struct backup_disk *bd = o->ndisks > 1 ? &o->disks[i] : &single;

    d->o = *o;
    d->o.socket = bd->socket;
    d->o.uri = bd->uri;
    d->o.session = NULL;
    d->status = EXIT_FAILED;
    d->name = o->ndisks > 1 ? bd->name : o->disk ? o->disk : "disk";
  }
  group_id (&g);

  status = group_prepare (&g);
  if (status != EXIT_OK)
    goto out;
  if (o->pre_snapshot &&
      run_hook (&g, "pre", o->pre_snapshot, -1) == -1) {
    backup_error ("the pre-snapshot hook failed: no snapshot was taken");
    status = EXIT_FAILED;
    hooks_failed = true;
  }
  else if (group_snapshots (&g) == -1)
    status = EXIT_FAILED;
  if (o->post_snapshot &&
      run_hook (&g, "post", o->post_snapshot, status) == -1 &&
      status == EXIT_OK) {
    /* The snapshots are taken and good: the copy goes on, the run
     * fails at the end for the hook.
     */
    hooks_failed = true;
  }
  if (status != EXIT_OK)
    goto out;

  /* 7. Each disk's copy; each run's record names the group. */
  info = json_pack ("{s:I}", "held_ms", (json_int_t) (g.held_s * 1000 + 0.5));
  if (info && g.n > 1) {
    json_t *names = json_array ();
    for (size_t i = 0; names && i < g.n; ++i)
      json_array_append_new (names, json_string (g.disks[i].name));
    json_object_set_new (info, "group_disks", names);
  }
  tool_out.json = false;        /* one document for the group, below */
  for (size_t i = 0; i < g.n; ++i) {
    struct group_disk *d = &g.disks[i];

    d->status = kind->complete (d->run, g.id, info);
    if (d->status != EXIT_OK) {
      backup_error ("disk %s: the copy failed; the other disks' runs of "
                    "group %s are kept", d->name, g.id);
      if (status == EXIT_OK)
        status = d->status;
    }
  }
  tool_out.json = json;
  if (status == EXIT_OK && hooks_failed)
    status = EXIT_FAILED;

 out:
  tool_out.json = json;
  if (tool_out.json)
    group_json (&g, status);
  for (size_t i = g.n; i-- > 0;) {
    struct group_disk *d = &g.disks[i];

    if (d->run)
      kind->end (d->run, d->status == EXIT_OK);
    if (d->session_open)
      session_close (&d->o);
  }
  ssh_master_stop (&g.ssh);
  free (g.ssh_options);
  json_decref (info);
  free (g.disks);
  return status;
}

int
cmd_backup_group (struct backup_options *o, const char *repo)
{
  return backup_group (o, repo, &backup_chain_kind, NULL);
}

/* --- the disks on the command line --- */

int
backup_disk_option (struct backup_options *o, int opt, const char *arg)
{
  struct backup_disk *d = o->ndisks ? &o->disks[o->ndisks - 1] : NULL;

  switch (opt) {
  case 'd':
    o->disks[o->ndisks++].name = arg;
    if (o->disk == NULL)
      o->disk = arg;
    return EXIT_OK;
  case 'S':
    if (d == NULL)
      o->socket = arg;
    else if (d->socket == NULL)
      d->socket = arg;
    else {
      tool_error ("-S %s: disk %s has its -S already: give each --disk "
                  "NAME its own -S and -u", arg, d->name);
      return EXIT_USAGE;
    }
    return EXIT_OK;
  case 'u':
    if (d == NULL)
      o->uri = arg;
    else if (d->uri == NULL)
      d->uri = arg;
    else {
      tool_error ("-u %s: disk %s has its -u already: give each --disk "
                  "NAME its own -S and -u", arg, d->name);
      return EXIT_USAGE;
    }
    return EXIT_OK;
  }
  abort ();
}

int
backup_disks_resolve (struct backup_options *o, const char *cmd)
{
  struct backup_disk *d = &o->disks[0];

  if (o->ndisks == 0)
    return EXIT_OK;
  if (o->ndisks > 1) {
    if (strcmp (cmd, "backup") != 0) {
      tool_error ("%s: one --disk at a time (only backup takes several)",
                  cmd);
      return EXIT_USAGE;
    }
    if (o->socket || o->uri) {
      tool_error ("backup of several disks: give each --disk NAME its own "
                  "-S and -u after it, none before");
      return EXIT_USAGE;
    }
    for (size_t i = 0; i < o->ndisks; ++i) {
      if (o->disks[i].socket == NULL || o->disks[i].uri == NULL) {
        tool_error ("--disk %s: give its -S CONTROL and -u NBD_URI after it",
                    o->disks[i].name);
        return EXIT_USAGE;
      }
      for (size_t j = 0; j < i; ++j)
        if (strcmp (o->disks[i].name, o->disks[j].name) == 0) {
          tool_error ("--disk %s is given twice", o->disks[i].name);
          return EXIT_USAGE;
        }
    }
    return EXIT_OK;
  }
  if ((d->socket && o->socket) || (d->uri && o->uri)) {
    tool_error ("--disk %s: its -S and -u go either before the command or "
                "after --disk, not both", d->name);
    return EXIT_USAGE;
  }
  if (d->socket)
    o->socket = d->socket;
  if (d->uri)
    o->uri = d->uri;
  return EXIT_OK;
}
